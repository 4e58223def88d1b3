"""Checkpoints over the data plane: servers send their blocks to the AM (checkpoint_blocks), the AM
writes psruntime.store.checkpoint's files and sends them back (restore_blocks_data); batches stay under a
frame's body limit; unowned blocks and malformed batches are refused and change nothing."""
from __future__ import annotations

import asyncio
import json
import re
from contextlib import AbstractAsyncContextManager

import msgspec
import numpy as np
import pytest

from appmaster.container_book import AmContainer
from protocol.checkpoint_manifest import JobRecord
from appmaster.ps.checkpoints import Checkpointer
from appmaster.ps.runtime.executor_pool import ExecutorRecord, ExecutorState, Role
from appmaster.ps.runtime.executor_rpc import ExecutorCallError
from protocol import executor_ops as ops
from protocol.records import Resource
from psruntime.store.block_store import BlockArrays, BlockStore
from psruntime.control_ops import bind
from psruntime.store.checkpoint import (CheckpointCut, CheckpointError, load_blocks, pack_blocks, save_blocks,
                                  unpack_blocks, write_block)
from psruntime.wire.dataplane import DataPlaneClient, RemoteError
from psruntime.executor import Executor
from psruntime.store.migration_controller import MigrationController
from psruntime.store.ownership_table import block_of
from psruntime.store.store_client import StoreClient
from store_cluster import executor_cluster

NB = 8
DIM = 16
INT_KEYS = list(range(400))
COUNTER = "eps:minibatches"          # the audit counter: a str key beside the dense rows
ODD_KEY = 10**6                      # an int key of another layout than the dense rows
FRAME_LIMIT = 8 << 10                # a small body limit, so the model spans many frames


def _record(e: Executor, seq: int) -> ExecutorRecord:
    c = AmContainer(container_id=f"container_1_0001_01_{seq:06d}", node_id="n1:1", node_http_address="n1:1",
                    resource=Resource(512, 1), token="t")
    return ExecutorRecord(e.executor_id, Role.SERVER, c, ExecutorState.READY, e.address,
                          blocks=e.service.owned_blocks())


def servers(n: int, max_body_bytes: int | None = None
            ) -> AbstractAsyncContextManager[tuple[list[Executor], MigrationController, DataPlaneClient]]:
    """In-process executors on localhost, optionally reading frames of at most `max_body_bytes`."""
    return executor_cluster(n, NB, max_body_bytes)


def _model() -> dict:
    """A model: dense float32 rows, the audit counter and an int key of another layout."""
    model = {k: np.arange(DIM, dtype=np.float32) + k for k in INT_KEYS}
    model[COUNTER] = np.array([42.0])
    model[ODD_KEY] = np.array([7, 8], np.int64)
    return model


async def _fill(ctl: MigrationController) -> dict:
    model = _model()
    c = StoreClient(ctl.table)
    await c.put(list(model), list(model.values()))
    await c.close()
    return model


async def _pull(ctl: MigrationController, keys: list) -> dict:
    c = StoreClient(ctl.table)
    try:
        return await c.pull(keys)
    finally:
        await c.close()


def _assert_model(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
        assert got[k].dtype == want[k].dtype


async def test_blocks_round_trip_through_the_am(tmp_path) -> None:
    async with servers(2) as (executors, ctl, dp):
        model = await _fill(ctl)
        recs = [_record(e, i) for i, e in enumerate(executors)]
        ckpt = Checkpointer(tmp_path, dp, batch_bytes=4096)        # several batches per server
        info = await ckpt.write(3, ctl.table, recs, JobRecord(objective=1.5))
        assert info.bytes > 2 * 4096 and ckpt.last == info
        d = tmp_path / "epoch-3"
        assert sorted(p.name for p in d.glob("manifest-*.json")) == ["manifest-e0.json", "manifest-e1.json"]
        assert json.loads((d / "job.json").read_text())["objective"] == 1.5
        saved = load_blocks(d, NB)          # the files the AM wrote are psruntime.store.checkpoint's format
        assert sorted(saved) == list(range(NB))
        assert saved[block_of(COUNTER, NB)].other_keys.count(COUNTER) == 1
        # the model changes, then the checkpoint brings it back
        c = StoreClient(ctl.table)
        await c.put(list(model), [np.zeros_like(v) for v in model.values()])
        await c.close()
        sent = await ckpt.restore(d, recs, NB)
        assert sent == info.bytes
        _assert_model(await _pull(ctl, list(model)), model)


async def test_restore_onto_another_shape_of_servers(tmp_path) -> None:
    async with servers(2) as (executors, ctl, dp):
        model = await _fill(ctl)
        await Checkpointer(tmp_path, dp).write(1, ctl.table, [_record(e, i) for i, e in enumerate(executors)], JobRecord())
    async with servers(3) as (executors, ctl, dp):       # a restarted job: three fresh servers
        await Checkpointer(tmp_path, dp, batch_bytes=1).restore(
            tmp_path / "epoch-1", [_record(e, i) for i, e in enumerate(executors)], NB)
        _assert_model(await _pull(ctl, list(model)), model)


class ReportingMore(ops.CheckpointBlocksReply):
    """A newer executor's reply: a field this AM does not know."""

    compressed: bool = False


class WithoutBlocks(ops.ControlReply):
    """A broken reply: no `blocks`."""

    cut: int
    num_blocks: int
    remaining: list[int] = []


async def test_the_am_reads_checkpoint_replies_by_their_record(tmp_path) -> None:
    """A reply field the AM does not know is ignored (an executor may report more); a reply that
    lacks one the AM needs fails the checkpoint naming the executor, the op and the field."""
    async with servers(2) as (executors, ctl, dp):
        model = await _fill(ctl)
        e0 = executors[0]
        recs = [_record(e, i) for i, e in enumerate(executors)]
        serve = e0.checkpoints.checkpoint_blocks

        def reporting_more(req, arrays):
            reply, out = serve(req, arrays)
            return ReportingMore(**msgspec.structs.asdict(reply), compressed=False), out
        e0.replace_op(ops.CheckpointBlocks, bind(ops.CheckpointBlocks, reporting_more)[1])
        info = await Checkpointer(tmp_path, dp, batch_bytes=4096).write(1, ctl.table, recs, JobRecord())
        assert sorted(load_blocks(info.dir, NB)) == list(range(NB))

        def without_blocks(req, arrays):
            reply, out = serve(req, arrays)
            return WithoutBlocks(cut=reply.cut, num_blocks=reply.num_blocks, remaining=reply.remaining), out
        e0.replace_op(ops.CheckpointBlocks, bind(ops.CheckpointBlocks, without_blocks)[1])
        with pytest.raises(ExecutorCallError, match="checkpoint_blocks on e0 .* missing required field `blocks`"):
            await Checkpointer(tmp_path, dp).write(2, ctl.table, recs, JobRecord())
        _assert_model(await _pull(ctl, list(model)), model)


async def test_a_model_larger_than_a_frame_travels_in_several(tmp_path) -> None:
    async with servers(1, max_body_bytes=FRAME_LIMIT) as (executors, ctl, dp):
        model = _model()
        for k, v in model.items():        # in place: one put of the whole model is over the limit too
            executors[0].service.store.put(k, v)
        nbytes = executors[0].service.store.nbytes()
        assert nbytes > 2 * FRAME_LIMIT
        # one reply with everything is more than the AM's connection reads: it is refused
        with pytest.raises(ConnectionError):
            await dp.request(executors[0].address, {"op": "checkpoint_blocks", "max_bytes": 1 << 30})
        rec = _record(executors[0], 0)
        ckpt = Checkpointer(tmp_path, dp, batch_bytes=FRAME_LIMIT // 2)
        info = await ckpt.write(2, ctl.table, [rec], JobRecord())
        assert info.bytes >= nbytes
        executors[0].service.store.update(0, "add", np.ones(DIM, np.float32))
        await ckpt.restore(info.dir, [rec], NB)       # and back, in frames the server accepts
        _assert_model(await _pull(ctl, list(model)), model)


async def test_a_cut_is_consistent_and_sent_in_bounded_batches() -> None:
    async with servers(1) as (executors, ctl, dp):
        model = await _fill(ctl)
        e = executors[0]
        addr = e.address
        first = await dp.request(addr, {"op": "checkpoint_blocks", "max_bytes": 1})
        h = first.header
        assert len(h["blocks"]) == 1 and len(h["remaining"]) == NB - 1    # one block per batch
        later = h["remaining"][-1]
        key = next(k for k in INT_KEYS if block_of(k, NB) == later)
        e.service.store.update(key, "add", np.full(DIM, 100, np.float32))  # after the cut was taken
        got = dict(unpack_blocks(h["blocks"], first.arrays, NB))
        while h["remaining"]:
            f = await dp.request(addr, {"op": "checkpoint_blocks", "cut": h["cut"], "max_bytes": 1})
            h = f.header
            got.update(unpack_blocks(h["blocks"], f.arrays, NB))
        assert sorted(got) == list(range(NB))
        row = int(np.searchsorted(got[later].keys, key))
        np.testing.assert_array_equal(got[later].values[row], model[key])   # the value at the cut
        with pytest.raises(RemoteError, match="no checkpoint cut"):     # sent completely: gone
            await dp.request(addr, {"op": "checkpoint_blocks", "cut": h["cut"]})


@pytest.mark.parametrize("header,msg", [
    ({"op": "checkpoint_blocks", "blocks": [1]}, r"blocks \[1\] are not owned by e0"),
    ({"op": "checkpoint_blocks", "blocks": "all"}, r"Expected `array \| null`, got `str` - at `\$\.blocks`"),
    ({"op": "checkpoint_blocks", "max_bytes": 0}, r"Expected `int` >= 1 - at `\$\.max_bytes`"),
    ({"op": "checkpoint_blocks", "cut": 99}, "no checkpoint cut 99 in progress on e0"),
])
async def test_bad_checkpoint_requests_are_refused(header, msg) -> None:
    async with servers(2) as (executors, ctl, dp):
        await _fill(ctl)
        with pytest.raises(RemoteError, match=msg):
            await dp.request(executors[0].address, header)


async def test_restoring_unowned_or_malformed_blocks_changes_nothing() -> None:
    async with servers(2) as (executors, ctl, dp):
        model = await _fill(ctl)
        e0 = executors[0]
        own, other = e0.service.owned_blocks()[:2], executors[1].service.owned_blocks()[0]
        zero = {b: BlockArrays(e0.service.store.export_arrays(b).keys.copy(),
                               np.zeros_like(e0.service.store.export_arrays(b).values)) for b in own}
        # a block assigned to another server
        descs, arrays = pack_blocks([(own[0], zero[own[0]]), (other, zero[own[1]])])
        with pytest.raises(RemoteError, match=rf"blocks \[{other}\] are not assigned to e0; set ownership"):
            await dp.request(e0.address, {"op": "restore_blocks_data", "blocks": descs}, arrays)
        # buffers that do not add up to the blocks listed
        descs, arrays = pack_blocks([(own[0], zero[own[0]])])
        with pytest.raises(RemoteError, match="needs 2 buffers"):
            await dp.request(e0.address, {"op": "restore_blocks_data", "blocks": descs}, arrays[:1])
        with pytest.raises(RemoteError, match=r"Expected `array`, got `int` - at `\$\.blocks`"):
            await dp.request(e0.address, {"op": "restore_blocks_data", "blocks": 3})
        # the second block's keys belong elsewhere: the first one, already installed, is rolled back
        descs, arrays = pack_blocks([(own[0], zero[own[0]]), (own[1], zero[own[0]])])
        with pytest.raises(RemoteError, match="does not hash to block"):
            await dp.request(e0.address, {"op": "restore_blocks_data", "blocks": descs}, arrays)
        _assert_model(await _pull(ctl, list(model)), model)


async def test_restore_names_blocks_the_checkpoint_lacks(tmp_path) -> None:
    async with servers(2) as (executors, ctl, dp):
        await _fill(ctl)
        recs = [_record(e, i) for i, e in enumerate(executors)]
        d = tmp_path / "partial"
        d.mkdir()
        save_blocks(executors[0].service.store, executors[0].service.owned_blocks(), d, "e0", 0)
        with pytest.raises(CheckpointError, match=re.escape(f"blocks {recs[1].blocks} are not in the checkpoint")):
            await Checkpointer(tmp_path, dp).restore(d, recs, NB)


# ----- the pure parts ----------------------------------------------------------------------------

def _store() -> BlockStore:
    store = BlockStore(NB)
    for b in range(NB):
        store.create_block(b)
    for k in range(64):
        store.put(k, np.full(3, k, np.float32))
    store.put(COUNTER, np.array([5.0]))
    return store


def test_pack_and_unpack_are_inverse_and_check_their_input() -> None:
    store = _store()
    items = [(b, store.export_arrays(b)) for b in range(NB)]
    descs, arrays = pack_blocks(items)
    back = unpack_blocks(json.loads(json.dumps(descs)), arrays, NB)     # the header goes through JSON
    for (b, want), (b2, got) in zip(items, back):
        assert b == b2 and got.other_keys == want.other_keys
        np.testing.assert_array_equal(got.keys, want.keys)
        np.testing.assert_array_equal(got.values, want.values)
    with pytest.raises(CheckpointError, match="listed twice"):
        unpack_blocks(descs + descs, arrays + arrays, NB)
    with pytest.raises(CheckpointError, match=r"block id in \[0, 8\)"):
        unpack_blocks([{**descs[0], "block": NB}], arrays, NB)
    with pytest.raises(CheckpointError, match="frame has 1"):
        unpack_blocks([], arrays[:1], NB)
    with pytest.raises(CheckpointError, match="other_keys must be a list"):
        unpack_blocks([{**descs[0], "other_keys": [1.5]}], arrays, NB)


def test_a_cut_hands_out_batches_under_the_byte_budget() -> None:
    store = _store()
    cut = CheckpointCut.take(store, list(range(NB)), cut_id=1, table_version=0)
    sizes = []
    while cut.pending:
        batch = cut.next_batch(max_bytes=200, frame_limit=1 << 20)
        assert batch
        sizes.append(sum(d.keys.nbytes + d.nbytes for _, d in batch))
        assert len(batch) == 1 or sizes[-1] <= 200
    assert len(sizes) > 1
    big = CheckpointCut.take(store, [0], cut_id=2, table_version=0)
    with pytest.raises(CheckpointError, match="block 0 holds .* bytes, more than one data-plane frame"):
        big.next_batch(max_bytes=10, frame_limit=10)


def test_files_written_from_received_arrays_match_a_servers_own(tmp_path) -> None:
    store = _store()
    save_blocks(store, list(range(NB)), tmp_path / "server", "s", 0)
    (tmp_path / "am").mkdir()
    descs, arrays = pack_blocks([(b, store.export_arrays(b)) for b in range(NB)])
    for b, data in unpack_blocks(descs, arrays, NB):
        write_block(tmp_path / "am", b, data)
    for b in range(NB):
        assert (tmp_path / "server" / f"block_{b}.buf").read_bytes() == (tmp_path / "am" / f"block_{b}.buf").read_bytes()


async def test_a_refused_restore_names_the_server(tmp_path) -> None:
    async with servers(2) as (executors, ctl, dp):
        await _fill(ctl)
        recs = [_record(e, i) for i, e in enumerate(executors)]
        info = await Checkpointer(tmp_path, dp).write(0, ctl.table, recs, JobRecord())
        recs[0].blocks = recs[0].blocks + recs[1].blocks[:1]       # not what e0's table gives it
        with pytest.raises(ExecutorCallError, match=r"restore_blocks_data on e0 .* not assigned to e0"):
            await Checkpointer(tmp_path, dp).restore(info.dir, recs[:1], NB)


async def test_a_checkpoint_that_fails_midway_lets_the_servers_cut_go(tmp_path, monkeypatch) -> None:
    """The AM cannot write a batch (disk full): the checkpoint fails, and the server is told to let
    go of its cut, whose views would otherwise keep a copy of every block not yet sent until the
    next checkpoint."""
    import appmaster.ps.checkpoints as checkpoints_mod   # noqa: PLC0415
    async with servers(1) as (executors, ctl, dp):
        await _fill(ctl)

        def disk_full(*a, **kw):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(checkpoints_mod, "_write_blocks", disk_full)
        with pytest.raises(OSError, match="No space left"):
            await Checkpointer(tmp_path, dp, batch_bytes=1024).write(1, ctl.table, [_record(executors[0], 0)],
                                                                     JobRecord())
        with pytest.raises(RemoteError, match="no checkpoint cut 1 in progress"):
            await dp.request(executors[0].address, {"op": "checkpoint_blocks", "cut": 1, "max_bytes": 1})


async def test_when_one_servers_fetch_fails_the_others_stop_before_the_checkpoint_fails(tmp_path, monkeypatch) -> None:
    """Two servers; the AM cannot write the first batch it gets: the checkpoint fails only once the
    other server's fetch has stopped too (it does not go on writing into the directory) and both
    servers' cuts are let go."""
    import appmaster.ps.checkpoints as checkpoints_mod   # noqa: PLC0415
    async with servers(2) as (executors, ctl, dp):
        await _fill(ctl)
        calls: list[int] = []
        real = checkpoints_mod._write_blocks

        def first_fails(*a, **kw):
            calls.append(1)
            if len(calls) == 1:
                raise OSError(28, "No space left on device")
            return real(*a, **kw)
        monkeypatch.setattr(checkpoints_mod, "_write_blocks", first_fails)
        with pytest.raises(OSError, match="No space left"):
            await Checkpointer(tmp_path, dp, batch_bytes=1024).write(
                1, ctl.table, [_record(e, i) for i, e in enumerate(executors)], JobRecord())
        assert not [t for t in asyncio.all_tasks() if "Checkpointer._fetch" in t.get_coro().__qualname__]
        written = sorted(p.name for p in (tmp_path / "epoch-1").iterdir())
        for e in executors:
            with pytest.raises(RemoteError, match="no checkpoint cut 1 in progress"):
                await dp.request(e.address, {"op": "checkpoint_blocks", "cut": 1, "max_bytes": 1})
        assert sorted(p.name for p in (tmp_path / "epoch-1").iterdir()) == written    # nothing wrote since
