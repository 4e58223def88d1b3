"""Executor control ops and the store client against executors on localhost sockets:
bad input gets a clear error and changes nothing; pushes surface errors on flush."""
from __future__ import annotations

import inspect
import re
import subprocess
import sys
import typing

import msgspec
import numpy as np
import pytest

from protocol import executor_ops as ops
from psruntime.control_ops import bind, table
from psruntime.wire.dataplane import RemoteError
from psruntime.executor import Executor
from psruntime.wire.frame_codec import Frame
from psruntime.store.store_client import StoreClient, StoreClientError
from store_cluster import executor_cluster

NB = 4


@pytest.fixture
async def cluster():
    async with executor_cluster(2, NB) as c:
        yield c


async def test_put_get_update_and_missing(cluster) -> None:
    _, ctl, _ = cluster
    c = StoreClient(ctl.table)
    keys = list(range(10)) + ["w:bias"]
    await c.put(keys, [np.full(3, i, np.float32) for i in range(len(keys))])
    await c.update(keys, "max", [np.full(3, 5, np.float32)] * len(keys))
    got = await c.pull(keys + [999])
    assert 999 not in got
    for i, k in enumerate(keys):
        np.testing.assert_array_equal(got[k], np.full(3, max(i, 5), np.float32))
    assert await c.get(12345) is None
    await c.close()


@pytest.mark.parametrize("header,arrays,msg", [
    ({"op": "frobnicate"}, [], "unknown op 'frobnicate'"),
    ({"op": "get", "keys": []}, [], "non-empty list"),
    ({"op": "get", "keys": [1.5]}, [], "keys must be ints or strs"),
    ({"op": "put", "keys": [1, 2]}, [np.ones(1)], "2 keys but 1 value buffers"),
    ({"op": "update", "keys": [1]}, [np.ones(1)], "needs field 'func'"),
    ({"op": "update", "keys": "OWN1", "func": "pow"}, [np.ones(3)], "unknown update function 'pow'"),
    ({"op": "update", "keys": "OWN2", "func": "add"}, [np.ones(3), np.ones(4)], "shape"),
    ({"op": "set_ownership", "table": {"num_blocks": NB}}, [], "missing field 'owners'"),
    ({"op": "move_blocks", "blocks": "x"}, [], r"Expected `array`, got `str` - at `\$\.blocks`"),
    ({"op": "move_blocks", "blocks": [0], "dst": "e9"}, [], "missing required field `dst_address`"),
    ({"op": "switch_role", "role": "boss"}, [], r"Invalid enum value 'boss' - at `\$\.role`"),
    ({"op": "switch_role", "role": "worker"}, [], "move blocks"),
    ({"op": "take_ownership", "blocks": [0], "src": "e1"}, [], "cannot take ownership"),
    ({"op": "block_data", "block": 1, "keys": []}, [], "not incoming"),
    ({"op": "restore", "dir": "/nonexistent", "blocks": [0]}, [], "no checkpoint manifest"),
    ({"op": "start_worker", "worker_id": "w0"}, [], "unknown op"),   # the self-paced loop is gone
])
async def test_bad_requests_get_clear_errors_and_change_nothing(cluster, header, arrays, msg) -> None:
    executors, ctl, dp = cluster
    e0 = executors[0]
    c = StoreClient(ctl.table)
    own = [k for k in range(100) if ctl.table.owner_of(k) == "e0"][:2]  # keys e0 serves itself
    await c.put(own, [np.zeros(3), np.zeros(3)])
    if header.get("keys") in ("OWN1", "OWN2"):
        header = {**header, "keys": own[:int(header["keys"][-1])]}
    before = (e0.service.table.version, e0.service.owned_blocks(), e0.role)
    with pytest.raises(RemoteError, match=msg):
        await dp.request(e0.address, header, arrays)
    assert (e0.service.table.version, e0.service.owned_blocks(), e0.role) == before
    got = await c.pull(own)
    for k in own:
        np.testing.assert_array_equal(got[k], np.zeros(3))
    assert (await dp.request(e0.address, {"op": "ping"})).header["executor_id"] == "e0"
    await c.close()


async def test_control_fields_are_checked_against_their_records_before_the_op_runs(cluster) -> None:
    """A misspelt or ill-typed field of a control request is refused naming it and changes nothing,
    though the same request well-formed changes the executor (shown at the end)."""
    executors, ctl, dp = cluster
    e0, e1 = executors
    blocks = ctl.table.blocks_owned_by("e0")
    newer = {**ctl.table.to_wire(), "version": ctl.table.version + 1}
    adopt = {"op": "set_ownership", "table": newer}
    move = {"op": "move_blocks", "blocks": blocks, "dst": "e1", "dst_address": e1.address}
    switch = {"op": "switch_role", "role": "worker"}
    refused = [
        ({**adopt, "tabel": newer}, "'set_ownership': Object contains unknown field `tabel`"),
        ({**adopt, "table": [newer]}, r"'set_ownership': Expected `object`, got `array` - at `\$\.table`"),
        ({**move, "dts": "e1"}, "'move_blocks': Object contains unknown field `dts`"),
        ({**move, "blocks": blocks[0]}, r"'move_blocks': Expected `array`, got `int` - at `\$\.blocks`"),
        ({**move, "dst_address": 7}, r"'move_blocks': Expected `str`, got `int` - at `\$\.dst_address`"),
        ({**switch, "force": True}, "'switch_role': Object contains unknown field `force`"),
    ]

    def state() -> tuple[object, ...]:
        return (e0.service.table.version, e0.service.owned_blocks(), e0.role, e1.service.owned_blocks())

    before = state()
    for header, msg in refused:
        with pytest.raises(RemoteError, match=msg):
            await dp.request(e0.address, header)
        assert state() == before, header
    assert (await dp.request(e0.address, adopt)).header["adopted"]
    assert (await dp.request(e0.address, move)).header["moved"] == blocks
    assert (await dp.request(e0.address, switch)).header["role"] == "worker"
    assert state() == (before[0] + 1, [], "worker", list(range(NB)))


async def test_push_errors_surface_on_flush_and_next_call(cluster) -> None:
    _, ctl, _ = cluster
    c = StoreClient(ctl.table)
    await c.put([0], [np.zeros(3)])
    await c.push([0], [np.ones(5)])  # wrong shape: fails at the server, asynchronously
    with pytest.raises(StoreClientError, match="shape"):
        await c.flush()
    await c.push([0], [np.ones(5)])
    with pytest.raises(StoreClientError, match="earlier push failed"):
        for _ in range(100):
            await c.pull([0])
    await c.push([0], [np.ones(3)])
    await c.flush()
    np.testing.assert_array_equal(await c.get(0), np.ones(3))
    await c.close()


async def test_switch_role_after_moving_blocks_away(cluster) -> None:
    executors, ctl, dp = cluster
    c = StoreClient(ctl.table)
    await c.put(list(range(8)), [np.full(2, k, np.float64) for k in range(8)])
    await ctl.move(ctl.table.blocks_owned_by("e0"), "e0", "e1")
    reply = await dp.request(executors[0].address, {"op": "switch_role", "role": "worker"})
    assert reply.header == {"op": "ok", "role": "worker", "previous": "server", "id": reply.header["id"]}
    got = await c.pull(list(range(8)))  # the client's table is stale: redirects bring it through
    for k in range(8):
        np.testing.assert_array_equal(got[k], np.full(2, k, np.float64))
    assert c.redirects_followed > 0
    status = (await dp.request(executors[1].address, {"op": "status"})).header
    assert status["blocks"] == list(range(NB)) and status["table_version"] == ctl.table.version
    await c.close()


def test_executor_rejects_bad_flags() -> None:
    out = subprocess.run([sys.executable, "-m", "psruntime.executor", "--executor-id", "x", "--num-blocks", "0"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--num-blocks must be positive" in out.stderr


class EchoExtra(ops.ExecutorRequest, tag="echo_extra"):
    """A test-only op another layer could add."""

    n: int


class EchoReply(ops.ControlReply):
    n: int


async def test_extra_ops_are_dispatched_and_cannot_shadow_builtins(cluster) -> None:
    executors, _, dp = cluster
    e0 = executors[0]
    e0.register_ops(table(bind(EchoExtra, lambda req, arrays: (EchoReply(n=req.n), ()))))
    reply = await dp.request(e0.address, ops.to_header(EchoExtra(n=4)))
    assert ops.decode_reply(reply.header, EchoReply).n == 4
    with pytest.raises(RemoteError, match=r"'echo_extra': Expected `int`, got `str` - at `\$\.n`"):
        await dp.request(e0.address, {"op": "echo_extra", "n": "4"})
    with pytest.raises(ValueError, match="built into the executor"):
        e0.register_ops(table(bind(ops.Status, lambda req, arrays: (ops.Ok(), ()))))
    # The AM-paced app ops (psruntime.app_role) are registered by default.
    with pytest.raises(RemoteError, match="unknown app"):
        await dp.request(e0.address, {"op": "app_setup", "app": "nope"})


def test_every_request_type_has_a_handler_and_a_reply_type() -> None:
    """The executor serves every request record of the protocol, and each names its reply record."""
    e = Executor("e0", NB)
    request_types = set(typing.get_args(ops.ControlRequest))
    assert set(ops.REQUEST_TYPES.values()) == request_types
    assert e.request_types == request_types
    for kind in request_types:
        assert callable(e.handler_of(kind))
        assert issubclass(ops.REPLY_TYPES[kind], ops.ControlReply), kind


@pytest.mark.parametrize("header,kind,msg", [
    ({"op": "frobnicate"}, "RequestError", "unknown op 'frobnicate'"),
    ({"op": "switch_role", "role": "boss"}, "RequestError",
     r"'switch_role': Invalid enum value 'boss' - at `\$\.role`"),
    ({"op": "run_clock", "epoch": 0, "batches": 0, "num_workers": 1}, "RequestError",
     r"'run_clock': Expected `int` >= 1 - at `\$\.batches`"),
    ({"op": "take_ownership", "blocks": [0], "src": "e1", "force": True}, "RequestError",
     "'take_ownership': Object contains unknown field `force`"),
    ({"op": "eps_commit", "transfers": [{"split": 0, "dst_address": "h:1", "source": "post"}]}, "RequestError",
     r"'eps_commit': Invalid enum value 'post' - at `\$\.transfers\[0\]\.source`"),
    ({"op": "objective"}, "RequestError", "no app set up"),       # well-typed, refused by the op
])
async def test_a_bad_request_gets_the_typed_error_reply_naming_the_field(header, kind, msg) -> None:
    e = Executor("e0", NB)
    reply = e.handle(Frame({**header, "id": 1}))
    if inspect.isawaitable(reply):     # an async op refuses when it runs
        reply = await reply
    error = msgspec.convert(reply[0], ops.ErrorReply)
    assert error.kind == kind and re.search(msg, error.error), error
    assert reply[1] == () and e.role == "server"
