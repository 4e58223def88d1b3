"""The migration protocol step by step on real executors: queueing at the destination until the
data lands (served in arrival order), cancel, and abort when the destination is unreachable."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from polling import async_wait_until

from psruntime.wire.dataplane import DataPlaneClient, RemoteError
from psruntime.executor import Executor
from psruntime.store.migration import BlockState
from psruntime.store.migration_controller import MigrationController, MigrationControllerError
from psruntime.store.ownership_table import OwnershipTable

NB = 4


@pytest.fixture
async def pair():
    src, dst = Executor("src", NB), Executor("dst", NB)
    addrs = {"src": await src.start(), "dst": await dst.start()}
    ctl = MigrationController(OwnershipTable(NB, ["src"] * NB, addrs))
    await ctl.broadcast()
    dp = DataPlaneClient()
    yield src, dst, ctl, dp
    await dp.close()
    await ctl.close()
    await src.stop()
    await dst.stop()


async def test_destination_queues_until_data_then_serves_in_order(pair) -> None:
    src, dst, _, dp = pair
    key = 7
    block = src.service.table.block_of(key)
    await dp.request(src.address, {"op": "put", "keys": [key]}, [np.array([1.0])])
    await dp.request(dst.address, {"op": "take_ownership", "blocks": [block], "src": "src"})
    assert dst.service.states.state(block) is BlockState.INCOMING
    conn = await dp.connection(dst.address)
    f1 = conn.submit({"op": "update", "func": "add", "keys": [key]}, [np.array([10.0])])
    f2 = conn.submit({"op": "get", "keys": [key]})
    f3 = conn.submit({"op": "update", "func": "max", "keys": [key]}, [np.array([100.0])])
    await async_wait_until(lambda: dst.service.stats["queued"] == 3, what="the three requests queued at dst")
    assert not (f1.done() or f2.done() or f3.done())
    # The source's snapshot arrives: the queue drains in arrival order on top of it.
    await dp.request(dst.address, {"op": "block_data", "block": block, "keys": [key], "src": "src"},
                     [np.array([1.0])])
    assert (await f2).arrays[0].tolist() == [11.0]  # the add queued before it was applied first
    await f1, await f3
    got = await dp.request(dst.address, {"op": "get", "keys": [key]})
    assert got.arrays[0].tolist() == [100.0]


async def test_cancelled_incoming_redirects_its_queue(pair) -> None:
    src, dst, _, dp = pair
    block = src.service.table.block_of(3)
    await dp.request(dst.address, {"op": "take_ownership", "blocks": [block], "src": "src"})
    conn = await dp.connection(dst.address)
    queued = conn.submit({"op": "update", "func": "add", "keys": [3]}, [np.ones(2)])
    # queued before the cancel, so what is tested is the queue's drain, not a plain redirect
    await async_wait_until(lambda: dst.service.stats["queued"] == 1, what="the update queued at dst")
    await dp.request(dst.address, {"op": "cancel_incoming", "blocks": [block]})
    reply = (await queued).header
    assert reply["keys"] == [] and reply["redirect_keys"] == [3]
    assert reply["redirect"] == [[block, "src", src.address]]
    assert dst.service.states.state(block) is BlockState.ABSENT


async def test_move_to_unreachable_destination_aborts_and_keeps_serving(pair) -> None:
    src, dst, ctl, dp = pair
    block = src.service.table.block_of(5)
    await dp.request(src.address, {"op": "put", "keys": [5]}, [np.array([4.0])])
    dead = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    dead_addr = "127.0.0.1:%d" % dead.sockets[0].getsockname()[1]
    dead.close()
    await dead.wait_closed()
    ctl.add_executor("ghost", dead_addr)
    with pytest.raises(MigrationControllerError, match="move of blocks"):
        await ctl.move([block], "src", "ghost")
    assert src.service.states.state(block) is BlockState.OWNED
    assert ctl.table.owner_of_block(block) == "src"
    got = await dp.request(src.address, {"op": "get", "keys": [5]})
    assert got.arrays[0].tolist() == [4.0]
    # And the controller refuses moving a block twice at once.
    t = asyncio.create_task(ctl.move([block], "src", "dst"))
    await asyncio.sleep(0)
    with pytest.raises(MigrationControllerError, match="already being moved"):
        await ctl.move([block], "src", "dst")
    await t
    assert ctl.table.owner_of_block(block) == "dst"
    with pytest.raises(RemoteError, match="not owned here"):
        await dp.request(src.address, {"op": "move_blocks", "blocks": [block], "dst": "dst",
                                       "dst_address": dst.address})


async def test_a_move_that_goes_for_some_blocks_only_records_those(pair) -> None:
    """The destination refuses one block (it is already taking it from elsewhere) and takes the
    other: the AM's table names the destination as the owner of the one that went, and the
    move still fails, naming the one that did not."""
    src, dst, ctl, dp = pair
    refused, taken = 0, 1
    await dp.request(dst.address, {"op": "take_ownership", "blocks": [refused], "src": "elsewhere"})
    with pytest.raises(MigrationControllerError, match=rf"block {refused}: .*\(moved: \[{taken}\]\)"):
        await ctl.move([refused, taken], "src", "dst")
    assert ctl.table.owner_of_block(taken) == "dst" and ctl.table.owner_of_block(refused) == "src"
    assert dst.service.states.state(taken) is BlockState.OWNED
    assert src.service.states.state(refused) is BlockState.OWNED
    # Every executor has the table that says so (the move's broadcast).
    assert src.service.table.owner_of_block(taken) == "dst" and dst.service.table.version == ctl.table.version


async def test_a_resent_delivery_is_acknowledged_and_not_installed_again(pair) -> None:
    """The source resends a block's data when the connection broke before the ack; if the first
    copy had landed, the resend is answered as done and does not overwrite what was served since."""
    src, dst, _, dp = pair
    key = 7
    block = src.service.table.block_of(key)
    await dp.request(dst.address, {"op": "take_ownership", "blocks": [block], "src": "src"})
    data = {"op": "block_data", "block": block, "keys": [key], "src": "src"}
    await dp.request(dst.address, data, [np.array([1.0])])
    await dp.request(dst.address, {"op": "update", "func": "add", "keys": [key]}, [np.array([10.0])])
    await dp.request(dst.address, data, [np.array([1.0])])          # the resend: Ok
    got = await dp.request(dst.address, {"op": "get", "keys": [key]})
    assert got.arrays[0].tolist() == [11.0] and dst.service.states.state(block) is BlockState.OWNED
    with pytest.raises(RemoteError, match="not incoming"):          # another source's is refused
        await dp.request(dst.address, dict(data, src="other"), [np.array([5.0])])


async def refused_at_destination(pair, monkeypatch) -> tuple[int, int]:
    """Key 5 holds 4.0 at the source, and the destination refuses the data of any block sent to it
    (its import fails); the key and its block."""
    src, dst, _, dp = pair
    key = 5
    await dp.request(src.address, {"op": "put", "keys": [key]}, [np.array([4.0])])

    def refuse(*a, **kw):
        raise RuntimeError("cannot allocate the block's arrays")
    monkeypatch.setattr(dst.service, "receive_block", refuse)
    return key, src.service.table.block_of(key)


async def test_data_the_destination_could_not_take_leaves_the_block_served_at_the_source(pair, monkeypatch) -> None:
    """After the handover ack the data is refused (the destination's import failed): the source asks
    the destination to cancel, which confirms nothing was applied there, and serves the block again,
    instead of leaving it MOVED with the destination queueing its requests for ever."""
    src, dst, ctl, dp = pair
    key, block = await refused_at_destination(pair, monkeypatch)
    with pytest.raises(MigrationControllerError, match="the move was undone"):
        await ctl.move([block], "src", "dst")
    assert src.service.states.state(block) is BlockState.OWNED and dst.service.states.state(block) is BlockState.ABSENT
    assert ctl.table.owner_of_block(block) == "src"
    await dp.request(src.address, {"op": "update", "func": "add", "keys": [key]}, [np.array([1.0])])
    got = await dp.request(src.address, {"op": "get", "keys": [key]})
    assert got.arrays[0].tolist() == [5.0]


async def test_data_that_landed_though_its_answer_did_not_completes_the_move(pair, monkeypatch) -> None:
    """The destination installed the data but its answer failed: asked to cancel, it says the block
    landed from this source, so the move is done and the source lets its copy go."""
    src, dst, ctl, dp = pair
    key = 5
    block = src.service.table.block_of(key)
    await dp.request(src.address, {"op": "put", "keys": [key]}, [np.array([4.0])])
    real = dst.service.receive_block

    def landed_then_failed(*a, **kw):
        real(*a, **kw)
        raise RuntimeError("the answer was lost")
    monkeypatch.setattr(dst.service, "receive_block", landed_then_failed)
    assert await ctl.move([block], "src", "dst") > 0
    assert ctl.table.owner_of_block(block) == "dst" and dst.service.states.state(block) is BlockState.OWNED
    assert src.service.states.state(block) is BlockState.MOVED and not src.service.store.has_block(block)
    got = await dp.request(dst.address, {"op": "get", "keys": [key]})
    assert got.arrays[0].tolist() == [4.0]


async def test_a_move_cancelled_while_the_source_carries_it_out_is_still_recorded(pair) -> None:
    """The AM's step is cancelled while the source moves the block (an epoch aborted): the source
    completes the move anyway, and the AM's table records it before the cancellation goes on, so
    nothing acting on the table (a rollback) takes the destination for idle."""
    src, dst, ctl, _ = pair
    block = src.service.table.block_of(5)
    sent, answer = asyncio.Event(), asyncio.Event()

    class HeldAnswers(DataPlaneClient):
        async def request(self, address, header, arrays=()):
            reply = asyncio.ensure_future(super().request(address, header, arrays))
            if header.get("op") == "move_blocks":
                sent.set()
                await answer.wait()         # the answer is held until the test lets it through
            return await reply
    client = HeldAnswers()
    held = MigrationController(ctl.table, client)
    move = asyncio.ensure_future(held.move([block], "src", "dst"))
    await asyncio.wait_for(sent.wait(), 10)
    await async_wait_until(lambda: dst.service.states.state(block) is BlockState.OWNED, what="the move done at dst")
    move.cancel()
    answer.set()
    with pytest.raises(asyncio.CancelledError):
        await move
    assert held.table.owner_of_block(block) == "dst"
    await held.close()
    await client.close()


async def test_a_move_whose_callers_connection_drops_mid_delivery_still_completes(pair, monkeypatch) -> None:
    """The AM's connection to the source drops while the block's data is on its way (the data plane
    then cancels the move's handler): the move runs to its end anyway -- the destination owns the
    block and serves what it queued meanwhile, the source lets its copy go -- instead of the block
    staying MOVED at the source with the destination queueing its requests for ever."""
    src, dst, _, dp = pair
    key = 5
    block = src.service.table.block_of(key)
    await dp.request(src.address, {"op": "put", "keys": [key]}, [np.array([4.0])])
    sending, release = asyncio.Event(), asyncio.Event()
    real = src.client.request

    async def held_delivery(address, header, arrays=()):
        if header.get("op") == "block_data":
            sending.set()
            await release.wait()        # the data leaves once the test lets it
        return await real(address, header, arrays)
    monkeypatch.setattr(src.client, "request", held_delivery)
    am = DataPlaneClient()
    move = asyncio.ensure_future(am.request(src.address, {"op": "move_blocks", "blocks": [block], "dst": "dst",
                                                          "dst_address": dst.address}))
    await asyncio.wait_for(sending.wait(), 10)
    assert src.service.states.state(block) is BlockState.MOVED
    assert dst.service.states.state(block) is BlockState.INCOMING
    conn = await dp.connection(dst.address)
    queued = conn.submit({"op": "update", "func": "add", "keys": [key]}, [np.array([1.0])])
    await async_wait_until(lambda: dst.service.stats["queued"] == 1, what="the update queued at dst")
    open_before = src.server.connections
    await am.close()                    # the AM is gone: its move's handler is cancelled
    await async_wait_until(lambda: src.server.connections == open_before - 1,
                           what="the source saw the AM's connection go")
    with pytest.raises(ConnectionError):       # the AM learns nothing of the outcome
        await move
    release.set()
    await asyncio.wait_for(queued, 10)
    await async_wait_until(lambda: not src.service.store.has_block(block), what="the source let its copy go")
    assert dst.service.states.state(block) is BlockState.OWNED
    got = await dp.request(dst.address, {"op": "get", "keys": [key]})
    assert got.arrays[0].tolist() == [5.0]


async def test_a_lost_answer_to_the_sources_cancel_is_asked_again_and_the_move_undone(pair, monkeypatch) -> None:
    """The data is refused and the destination cancels, but that answer is lost: the source asks
    again (the destination reports the block cancelled again) and serves the block, instead of
    staying MOVED -- redirecting to the destination, which redirects back -- until clients give up."""
    src, dst, ctl, dp = pair
    key, block = await refused_at_destination(pair, monkeypatch)
    real_cancel = dst.service.cancel_incoming
    answers = []

    def cancel_then_lose_the_first_answer(*a, **kw):
        answer = real_cancel(*a, **kw)
        answers.append(answer)
        if len(answers) == 1:
            raise ConnectionResetError("the answer was lost")
        return answer
    monkeypatch.setattr(dst.service, "cancel_incoming", cancel_then_lose_the_first_answer)
    with pytest.raises(MigrationControllerError, match="the move was undone"):
        await ctl.move([block], "src", "dst")
    assert len(answers) == 2 and answers[1] == ([block], [])
    assert src.service.states.state(block) is BlockState.OWNED and dst.service.states.state(block) is BlockState.ABSENT
    got = await dp.request(src.address, {"op": "get", "keys": [key]})
    assert got.arrays[0].tolist() == [4.0]
