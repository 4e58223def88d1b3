"""Reconfiguration.release_servers (appmaster/ps/reconfiguration.py) against workers that never
answer: the step fails with ElasticOpFailed naming the deadline, which the controller's recovery
acts on, and the send is cancelled; workers that answer in time are waited for."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from appmaster.ps.clock_loop import ReplyDeadline
from appmaster.ps.eps_records import ElasticOpFailed
from appmaster.ps.reconfiguration import Reconfiguration
from protocol.records import Resource


def reconfiguration(send_all: Any, deadline_hit: asyncio.Event) -> Reconfiguration:
    async def deadline_sleep(seconds: float) -> None:     # the deadline comes when the test says
        await deadline_hit.wait()
    loop = SimpleNamespace(reply_deadline=ReplyDeadline(), slowest_clock_s=0.0, deadline_sleep=deadline_sleep,
                           boundaries=None)
    training = SimpleNamespace(loop=loop, rpc=SimpleNamespace(send_all=send_all), pool=None)
    return Reconfiguration(cast(Any, None), cast(Any, training), cast(Any, None), Resource(512, 1), set(),
                           lambda: True)


async def test_workers_that_never_let_go_fail_the_step_at_the_deadline() -> None:
    sent = asyncio.Event()
    cancelled: list[bool] = []

    async def never(workers: Any, op: Any) -> None:
        sent.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
    hit = asyncio.Event()
    r = reconfiguration(never, hit)
    step = asyncio.ensure_future(r.release_servers([], ["10.0.0.1:7000"]))
    await sent.wait()
    hit.set()
    with pytest.raises(ElasticOpFailed, match="did not let go of the old servers within 300s"):
        await step
    await asyncio.sleep(0)
    assert cancelled == [True]


async def test_workers_that_let_go_in_time_end_the_step() -> None:
    calls: list[Any] = []

    async def answer(workers: Any, op: Any) -> None:
        calls.append(op.servers)
    r = reconfiguration(answer, asyncio.Event())
    await r.release_servers([], ["10.0.0.1:7000"])
    assert calls == [["10.0.0.1:7000"]]
