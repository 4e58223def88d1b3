"""The AM's StartExecutors (appmaster/ps/reconfiguration.py `_start`) when fewer executors come than
asked within the launch timeout: all or nothing by default (what started is retired), and for a
restart's start (`keep_short`) the ones that announced themselves kept and named in the
LaunchFailed -- which the interpreter puts in its StepFailed, as the controller's restart planner
and the simulator expect (it goes on with them when that is the job's minimum)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from appmaster.container_book import AmContainer
from appmaster.ps.reconfiguration import LaunchFailed, Reconfiguration
from appmaster.ps.runtime.executor_pool import ExecutorPool, ExecutorRecord, ExecutorState, Role
from protocol.records import Resource

E = Resource(1024, 1)


class Asks:
    """The AM client's ask book, as far as a start uses it."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def add_ask(self, n: int, resource: Resource, **_: Any) -> int:
        ask_id = len(self.counts) + 1
        self.counts[ask_id] = n
        return ask_id

    def set_ask_count(self, ask_id: int, n: int) -> None:
        self.counts[ask_id] = n


class Recording(Reconfiguration):
    """Retiring is recorded instead of stopping processes."""

    retired: list[str]

    async def retire(self, recs: Any, released: bool = True) -> None:
        self.retired += [r.executor_id for r in recs]


async def start_with_two_of_three(keep_short: bool) -> tuple[Recording, BaseException]:
    pool = ExecutorPool(4)
    training = SimpleNamespace(pool=pool, rpc=None, loop=SimpleNamespace(boundaries=None))
    r = Recording(Asks(), training, None, E, set(), lambda: True, launch_timeout_s=0.2)  # type: ignore[arg-type]
    r.retired = []
    start = asyncio.ensure_future(r.start_executors(Role.WORKER, 3, keep_short=keep_short))
    await asyncio.sleep(0)          # its ask is made (one loop pass)
    for i, state in enumerate((ExecutorState.READY, ExecutorState.READY, ExecutorState.LAUNCHING)):
        eid = f"worker-{i + 1}"
        pool.executors[eid] = ExecutorRecord(eid, Role.WORKER, AmContainer(f"c{i}", "n1:1", "n1:8042", E, "", ask_id=1),
                                             state=state)
    with pytest.raises(LaunchFailed) as failed:
        await start
    return r, failed.value


async def test_a_start_short_of_its_count_retires_what_started() -> None:
    r, e = await start_with_two_of_three(keep_short=False)
    assert sorted(r.retired) == ["worker-1", "worker-2", "worker-3"] and e.started == []


async def test_a_restart_start_that_came_short_keeps_the_executors_that_announced_themselves() -> None:
    r, e = await start_with_two_of_three(keep_short=True)
    assert r.retired == ["worker-3"]                      # still launching: it goes
    assert sorted(x.executor_id for x in e.started) == ["worker-1", "worker-2"]
