"""The array wire form of the store's data ops against executors on localhost sockets: results,
bad input (a clear error that changes nothing), and exactly-once while blocks move."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from psruntime.wire.dataplane import RemoteError
from psruntime.store.ownership_table import OwnershipTable, blocks_of_int_keys
from psruntime.store.store_client import StoreClient, StoreClientError
from store_cluster import executor_cluster

NB = 8
WIDTH = 6


@pytest.fixture
async def cluster():
    async with executor_cluster(3, NB) as c:
        yield c


async def test_pull_put_push_arrays_across_owners(cluster) -> None:
    executors, ctl, _ = cluster
    c = StoreClient(ctl.table)
    keys = np.arange(0, 400, 2)
    await c.put_array(keys, np.repeat(keys[:, None], WIDTH, axis=1).astype(np.float32))
    await c.push_array(keys[:50], np.ones((50, WIDTH), np.float32))
    await c.push_array(keys[:10], np.ones((10, WIDTH), np.float32))
    await c.flush()
    probe = np.array([0, 1, 2, 398, 399, 18, 20])
    values, found = await c.pull_array(probe, (WIDTH,), np.float32)
    assert found.tolist() == [True, False, True, True, False, True, True]
    want = {0: 2, 2: 4, 398: 398, 18: 20, 20: 21}
    for i, k in enumerate(probe.tolist()):
        np.testing.assert_array_equal(values[i], np.full(WIDTH, want.get(k, 0), np.float32), err_msg=f"key {k}")
    assert all(e.service.store.nbytes() > 0 for e in executors)  # the keys were spread over every owner
    # The list API reads what the array API wrote, and the other way round.
    got = await c.pull([2, 398])
    np.testing.assert_array_equal(got[398], np.full(WIDTH, 398, np.float32))
    await c.put([1001], [np.full(WIDTH, 7, np.float32)])
    values, found = await c.pull_array(np.array([1001]), (WIDTH,), np.float64)  # read with a cast
    assert found.all() and values.dtype == np.float64 and (values == 7).all()
    values, found = await c.pull_array(np.zeros(0, np.int64), (WIDTH,))
    assert values.shape == (0, WIDTH) and found.shape == (0,)
    await c.close()


async def test_one_owner_pull_returns_the_reply_array(cluster) -> None:
    executors, ctl, _ = cluster
    table = OwnershipTable(NB, ["e1"] * NB, dict(ctl.table.addresses), ctl.table.version)
    for b in ctl.table.blocks_owned_by("e0") + ctl.table.blocks_owned_by("e2"):
        await ctl.move([b], ctl.table.owner_of_block(b), "e1")
    c = StoreClient(table)
    keys = np.arange(1000)
    await c.put_array(keys, np.ones((1000, WIDTH), np.float32))
    values, found = await c.pull_array(keys, (WIDTH,))
    assert found.all() and (values == 1).all()
    values += 1   # the result is the caller's to change (a writable view of the received frame)
    await c.close()


async def test_large_pulls_into_reused_reply_buffers_read_missing_keys_as_zeros(cluster) -> None:
    _, ctl, _ = cluster
    c = StoreClient(ctl.table)
    wide = 4096     # rows of 16 KiB: the replies are received and gathered into reused buffers
    keys = np.arange(4000)
    keys = keys[blocks_of_int_keys(keys, NB) == 0][:40]
    held, missing = keys[:20], keys[20:]
    await c.put_array(held, np.full((20, wide), 5, np.float32))
    for _ in range(3):   # each pull may get the buffer that the one before filled with fives
        values, found = await c.pull_array(held, (wide,))
        assert found.all() and (values == 5).all()
        del values
        # One block, half of it missing: the missing rows come first, where the pull before put fives.
        values, found = await c.pull_array(np.concatenate([missing, held]), (wide,))
        assert found.tolist() == [False] * 20 + [True] * 20
        assert (values[:20] == 0).all() and (values[20:] == 5).all()
        del values
        values, found = await c.pull_array(np.concatenate([missing, np.arange(5000, 5040)]), (wide,))
        assert not found.any() and (values == 0).all()                # across blocks, none held
        del values
    await c.close()


@pytest.mark.parametrize("header,arrays,msg", [
    ({"op": "get", "key_array": True}, [], "carries 1 buffer"),
    ({"op": "get", "key_array": True, "dtype": "<f4", "shape": [3]}, [np.ones(2)], "integer dtype"),
    ({"op": "get", "key_array": True, "dtype": "<f4", "shape": [3]}, [np.ones((2, 2), np.int64)], "1-D"),
    ({"op": "get", "key_array": True, "dtype": "<f4", "shape": [3]}, [np.zeros(0, np.int64)], "at least one"),
    ({"op": "get", "key_array": True, "shape": [3]}, [np.arange(2)], "needs field 'dtype'"),
    ({"op": "get", "key_array": True, "dtype": "|O", "shape": [3]}, [np.arange(2)], "not allowed"),
    ({"op": "get", "key_array": True, "dtype": "<f4", "shape": 3}, [np.arange(2)], "field 'shape'"),
    ({"op": "get", "key_array": True, "dtype": "<f4", "shape": [4]}, [np.arange(2)], "asks for"),
    ({"op": "get", "key_array": True, "dtype": "<f8", "shape": [1 << 40]}, [np.arange(2)], "over the frame limit"),
    ({"op": "put", "key_array": True}, [np.arange(3), np.ones((2, 3))], "one row per key"),
    ({"op": "update", "key_array": True, "func": "pow"}, [np.arange(3), np.ones((3, 3))], "unknown update"),
    ({"op": "update", "key_array": True, "func": "add"}, [np.arange(3), np.ones((3, 4))], "shape"),
    ({"op": "update", "key_array": True, "func": "add"}, [np.arange(3), np.ones((3, 3), np.complex64)],
     "cannot update"),
])
async def test_bad_array_requests_get_clear_errors_and_change_nothing(cluster, header, arrays, msg) -> None:
    executors, ctl, dp = cluster
    # e0 owns every block here, so a request hits one executor whatever its keys.
    for b in range(NB):
        if ctl.table.owner_of_block(b) != "e0":
            await ctl.move([b], ctl.table.owner_of_block(b), "e0")
    c = StoreClient(ctl.table)
    await c.put_array(np.arange(3), np.zeros((3, 3), np.float32))
    with pytest.raises(RemoteError, match=msg):
        await dp.request(executors[0].address, header, arrays)
    values, found = await c.pull_array(np.arange(3), (3,))
    assert found.all() and (values == 0).all()
    assert (await dp.request(executors[0].address, {"op": "ping"})).header["executor_id"] == "e0"
    await c.close()


async def test_client_side_errors_name_the_problem(cluster) -> None:
    _, ctl, _ = cluster
    c = StoreClient(ctl.table)
    with pytest.raises(StoreClientError, match="integer dtype"):
        await c.pull_array(np.array([1.5]), (2,))
    with pytest.raises(ValueError, match="3 keys but values of shape"):
        await c.push_array(np.arange(3), np.ones((2, 2)))
    await c.push_array(np.arange(3), np.ones((3, 2), np.float32))
    await c.push_array(np.arange(3), np.ones((3, 5), np.float32))   # wrong shape: fails at the server
    with pytest.raises(StoreClientError, match="shape"):
        await c.flush()
    unowned = StoreClient(OwnershipTable(NB, [""] * NB, {}, 0))
    with pytest.raises(StoreClientError, match="no owner known for key"):
        await unowned.pull_array(np.arange(3), (2,))
    await c.close()


async def test_array_pushes_exactly_once_while_blocks_move(cluster) -> None:
    executors, ctl, _ = cluster
    keys = np.arange(48)
    clients = [StoreClient(ctl.table) for _ in range(3)]
    stop = asyncio.Event()
    moves = 0

    async def mover() -> None:
        nonlocal moves
        rng = np.random.default_rng(3)
        while not stop.is_set():
            block = int(rng.integers(NB))
            src = ctl.table.owner_of_block(block)
            await ctl.move([block], src, f"e{(int(src[1:]) + 1 + int(rng.integers(2))) % 3}")
            moves += 1
            await asyncio.sleep(0)

    async def hammer(c: StoreClient, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        sent = np.zeros((len(keys), WIDTH))
        for i in range(120):
            k = np.sort(rng.choice(keys, size=12, replace=False))
            d = rng.integers(-5, 6, size=(12, WIDTH)).astype(np.float64)
            sent[k] += d
            if i % 3:
                await c.push_array(k, d)
            else:
                await c.update_array(k, d)
            if i % 10 == 0:
                await c.pull_array(k, (WIDTH,), np.float64)   # gets meet the moves too
            await asyncio.sleep(0)
        await c.flush()
        return sent

    task = asyncio.create_task(mover())
    parts = await asyncio.gather(*(hammer(c, s) for s, c in enumerate(clients)))
    stop.set()
    await task
    assert moves >= 10, f"only {moves} moves happened during the run"
    values, found = await StoreClient(ctl.table).pull_array(keys, (WIDTH,), np.float64)
    np.testing.assert_array_equal(values, sum(parts))
    assert sum(c.redirects_followed for c in clients) > 0, "no request ever met a migration"
    assert sum(e.service.stats["redirected"] for e in executors) > 0
    for c in clients:
        await c.close()
