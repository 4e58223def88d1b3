"""EPS worker-to-worker data transmission between real executors on localhost sockets (in one
process): splits staged while an epoch could run, committed with their worker-local state,
kept as inactive copies on disk by their senders, and taken back by re-activation (only the
state travels); bad requests get a clear error and change nothing."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from psruntime.apps.blocks import DataBlock
from psruntime.wire.dataplane import DataPlaneClient, RemoteError
from psruntime.eps.eps_inactive_store import InactiveSplits, InactiveStoreError
from psruntime.executor import Executor
from psruntime.store.migration_controller import MigrationController
from psruntime.store.ownership_table import OwnershipTable

NB = 4
APP = {"app": "nmf", "data": {}, "hparams": {"max_epochs": 3}}   # NMF: each split carries state W


@pytest.fixture
async def job(tmp_path: Path):
    server = Executor("server-0", NB)
    workers = [Executor(f"worker-{i}", NB, role="worker") for i in range(3)]
    addrs = {e.executor_id: await e.start() for e in [server, *workers]}
    for w in workers:
        w.eps.inactive = InactiveSplits(tmp_path / w.executor_id)
    ctl = MigrationController(OwnershipTable.round_robin(NB, ["server-0"], addrs))
    await ctl.broadcast()
    dp = DataPlaneClient()
    for e in [server, *workers]:
        await dp.request(e.address, {"op": "app_setup", **APP})
    for i, w in enumerate(workers[:2]):
        await dp.request(w.address, {"op": "worker_setup", "partition": i, "num_partitions": 2})
    await dp.request(workers[2].address, {"op": "eps_join"})
    await dp.request(workers[0].address, {"op": "init_model"})
    for w in workers[:2]:
        await dp.request(w.address, {"op": "init_blocks"})
    yield server, workers, dp
    await dp.close()
    await ctl.close()
    for e in [server, *workers]:
        await e.stop()


async def datasets(dp: DataPlaneClient, w: Executor) -> dict:
    h = dict((await dp.request(w.address, {"op": "eps_datasets"})).header)
    h.pop("id", None)          # the frame's request id
    return h


def block_of(w: Executor, split: int) -> DataBlock:
    return next(b for b in w.app_role.blocks if b.block_index == split)


def same_block(a: DataBlock, b: DataBlock) -> bool:
    return (a.block_index, a.row_start, a.num_rows) == (b.block_index, b.row_start, b.num_rows) and \
        all(np.array_equal(a.data[k], b.data[k]) for k in a.data) and set(a.data) == set(b.data) and \
        all(np.array_equal(a.state[k], b.state[k]) for k in a.state) and set(a.state) == set(b.state)


async def test_add_then_remove_a_worker_moves_splits_and_reactivates_inactive_copies(job) -> None:
    _, (w0, w1, w2), dp = job
    await dp.request(w0.address, {"op": "run_epoch", "epoch": 0, "num_workers": 2})   # state W changes
    split = (await datasets(dp, w0))["active"][-1]
    original = block_of(w0, split)
    before = DataBlock(original.app, split, original.row_start, original.num_rows, dict(original.data),
                       {k: v.copy() for k, v in original.state.items()})

    # add: stage the data (may overlap an epoch), then commit at the boundary with the state
    r = await dp.request(w0.address, {"op": "eps_send_data", "splits": [split], "dst_address": w2.address})
    assert r.header["bytes"] > 0
    assert (await datasets(dp, w2))["staged"] == [split]
    r = await dp.request(w0.address, {"op": "eps_commit", "keep_inactive": True,
                                      "transfers": [{"split": split, "dst_address": w2.address, "source": "staged"}]})
    assert r.header["done"] == [split] and not r.header["failed"]
    assert r.header["bytes"] == sum(a.nbytes for a in before.state.values())   # only the state at commit
    d0, d2 = await datasets(dp, w0), await datasets(dp, w2)
    assert split not in d0["active"] and d0["inactive"] == [split]
    assert d2["active"] == [split] and d2["staged"] == []
    assert same_block(block_of(w2, split), before)

    # the new worker trains on it: its state moves on
    await dp.request(w2.address, {"op": "run_epoch", "epoch": 1, "num_workers": 3})
    trained = block_of(w2, split)
    assert not np.array_equal(trained.state["W"], before.state["W"])

    # remove: the split goes home by re-activation; only the new state travels, the data is local
    r = await dp.request(w2.address, {"op": "eps_commit", "keep_inactive": False,
                                      "transfers": [{"split": split, "dst_address": w0.address, "source": "inactive"}]})
    assert r.header["done"] == [split]
    assert r.header["bytes"] == sum(a.nbytes for a in trained.state.values())   # W and its place in the epoch
    d0, d2 = await datasets(dp, w0), await datasets(dp, w2)
    assert split in d0["active"] and d0["inactive"] == [] and d2["active"] == []
    back = block_of(w0, split)
    assert same_block(back, trained)                       # the trained state, not the stale copy
    assert d0["active"] == sorted(d0["active"])            # trained in global split order
    await dp.request(w0.address, {"op": "run_epoch", "epoch": 2, "num_workers": 2})


async def test_a_split_can_travel_whole_in_the_commit(job) -> None:
    _, (w0, w1, w2), dp = job
    split = (await datasets(dp, w1))["active"][0]
    expected = block_of(w1, split)
    r = await dp.request(w1.address, {"op": "eps_commit", "transfers": [
        {"split": split, "dst_address": w2.address, "source": "message"}]})
    assert r.header["done"] == [split]
    assert (await datasets(dp, w1))["inactive"] == []      # keep_inactive defaults to off
    assert same_block(block_of(w2, split), expected)


@pytest.mark.parametrize("header,msg", [
    ({"op": "eps_send_data", "splits": [999], "dst_address": "127.0.0.1:1"}, "not in the active dataset"),
    ({"op": "eps_send_data", "splits": "x", "dst_address": "127.0.0.1:1"}, r"Expected `array`, got `str` - at `\$\.splits`"),
    ({"op": "eps_send_data", "splits": [0], "dst_address": "nowhere"}, "host:port"),
    ({"op": "eps_commit", "transfers": []}, "non-empty list"),
    ({"op": "eps_commit", "transfers": [{"split": 0, "dst_address": "127.0.0.1:1", "source": "carrier pigeon"}]},
     r"Invalid enum value 'carrier pigeon' - at `\$\.transfers\[0\]\.source`"),
    ({"op": "eps_activate", "split": 0, "block": "x", "source": "staged"}, r"Expected `object`, got `str` - at `\$\.block`"),
    ({"op": "eps_stage", "split": "zero"}, r"Expected `int`, got `str` - at `\$\.split`"),
])
async def test_bad_requests_get_clear_errors_and_change_nothing(job, header: dict, msg: str) -> None:
    _, (w0, _w1, _w2), dp = job
    before = await datasets(dp, w0)
    with pytest.raises(RemoteError, match=msg):
        await dp.request(w0.address, header)
    assert await datasets(dp, w0) == before


async def test_activation_without_data_is_refused(job) -> None:
    _, (w0, _w1, w2), dp = job
    split = (await datasets(dp, w0))["active"][0]
    r = await dp.request(w0.address, {"op": "eps_commit", "keep_inactive": True, "transfers": [
        {"split": split, "dst_address": w2.address, "source": "staged"}]})   # nothing was staged
    assert r.header["done"] == [] and "was not staged" in r.header["failed"][str(split)]
    assert split in (await datasets(dp, w0))["active"] and (await datasets(dp, w2))["active"] == []


def test_inactive_store_round_trip_and_corruption(tmp_path: Path) -> None:
    store = InactiveSplits(tmp_path / "inactive")
    assert store.splits() == [] and store.nbytes() == 0
    b = DataBlock("x", 7, 700, 3, {"indptr": np.arange(4, dtype=np.int64), "v": np.ones(3, np.float32)},
                  {"W": np.full((3, 2), 0.5, np.float32)})
    store.put(b)
    assert store.splits() == [7] and store.contains(7)
    got = store.get(7)
    assert got.block_index == 7 and np.array_equal(got.data["v"], b.data["v"]) and np.array_equal(got.state["W"], b.state["W"])
    path = tmp_path / "inactive" / "split-000007.blk"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(InactiveStoreError, match="corrupt"):
        store.get(7)
    store.discard(7)
    with pytest.raises(InactiveStoreError, match="not in the inactive dataset"):
        store.get(7)


async def test_a_commit_whose_inactive_copy_cannot_be_kept_still_moves_every_split_once(job, monkeypatch) -> None:
    """Two splits go whole to the new worker with keep_inactive, and keeping the first one's copy
    fails (a full disk): both leave the sender's dataset -- none is trained by two workers -- the
    reply lists both as done and says which copy was not kept."""
    _, (w0, _w1, w2), dp = job
    splits = (await datasets(dp, w0))["active"][:2]

    def disk_full(block: DataBlock) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(w0.eps.inactive, "put", disk_full)
    r = await dp.request(w0.address, {"op": "eps_commit", "keep_inactive": True, "transfers": [
        {"split": s, "dst_address": w2.address, "source": "message"} for s in splits]})
    assert sorted(r.header["done"]) == sorted(splits) and r.header["failed"] == {}
    assert set(r.header["not_kept"]) == {str(s) for s in splits}
    assert "No space left" in r.header["not_kept"][str(splits[0])]
    held = await datasets(dp, w0)
    assert not set(splits) & set(held["active"]) and held["inactive"] == []
    assert set(splits) <= set((await datasets(dp, w2))["active"])


async def test_splits_a_spilling_worker_receives_are_spilled_as_its_own(tmp_path: Path, monkeypatch) -> None:
    """A worker with spill_alpha 0.5 takes two whole splits from another: one of them goes to its
    disk, as half of its own would -- it kept both in memory, the case spill exists for."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", str(tmp_path))          # the spill dir is the container's working dir
    server = Executor("server-0", NB)
    workers = [Executor(f"worker-{i}", NB, role="worker") for i in range(2)]
    addrs = {e.executor_id: await e.start() for e in [server, *workers]}
    ctl = MigrationController(OwnershipTable.round_robin(NB, ["server-0"], addrs))
    await ctl.broadcast()
    dp = DataPlaneClient()
    try:
        for e in [server, *workers]:
            await dp.request(e.address, {"op": "app_setup", **APP, "spill_alpha": 0.5})
        w0, w1 = workers
        await dp.request(w0.address, {"op": "worker_setup", "partition": 0, "num_partitions": 1})
        await dp.request(w1.address, {"op": "eps_join"})
        await dp.request(w0.address, {"op": "init_model"})
        await dp.request(w0.address, {"op": "init_blocks"})
        splits = (await datasets(dp, w0))["active"][:2]
        r = await dp.request(w0.address, {"op": "eps_commit", "transfers": [
            {"split": s, "dst_address": w1.address, "source": "message"} for s in splits]})
        assert sorted(r.header["done"]) == sorted(splits)
        reloader = w1.app_role.spill.reloader
        assert [b.block_index for b in w1.app_role.blocks] == sorted(splits)
        assert len(reloader.disk) == 1 and all(not b.data for b in w1.app_role.blocks if b.block_index in reloader.disk)
        # What stays with the sender is spilled at the same alpha too.
        left = w0.app_role.blocks
        assert len(w0.app_role.spill.reloader.disk & {b.block_index for b in left}) == len(left) // 2
    finally:
        await dp.close()
        await ctl.close()
        for e in [server, *workers]:
            await e.stop()
