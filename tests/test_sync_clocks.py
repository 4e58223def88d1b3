"""BSP / SSP clocks: pure semantics, async waiting, and workers joining and leaving."""
from __future__ import annotations

import asyncio

import pytest

from psruntime.clocks import ClockError, ClockService, ClockTable


def test_bsp_pure() -> None:
    t = ClockTable(0)
    t.add_worker("fast")
    t.add_worker("slow")
    assert t.can_start_next("fast")
    t.tick("fast")
    assert not t.can_start_next("fast")  # clock 1, min 0: waits for slow
    assert t.can_start_next("slow")
    t.tick("slow")
    assert t.can_start_next("fast") and t.min_clock() == 1


def test_ssp_pure_allows_s_ahead() -> None:
    t = ClockTable(2)
    t.add_worker("fast")
    t.add_worker("slow")
    for expected in (True, True, True, False):
        assert t.can_start_next("fast") is expected
        if expected:
            t.tick("fast")
    assert t.clock_of("fast") == 3 and t.clock_of("slow") == 0


def test_membership_changes() -> None:
    t = ClockTable(0)
    t.add_worker("a", 5)
    t.add_worker("b", 3)
    assert t.add_worker("c") == 3  # joins at the current minimum
    assert not t.can_start_next("a")
    t.remove_worker("b")
    t.remove_worker("c")
    assert t.can_start_next("a")
    with pytest.raises(ClockError, match="already"):
        t.add_worker("a")
    with pytest.raises(ClockError, match="unknown worker"):
        t.tick("zz")
    with pytest.raises(ClockError, match="staleness"):
        ClockTable(-1)


async def wait_until(cond, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("staleness", [0, 1, 3])
async def test_fast_worker_blocks_until_slow_catches_up(staleness: int) -> None:
    svc = ClockService(staleness)
    await svc.add_worker("fast")
    await svc.add_worker("slow")
    started: list[int] = []

    async def fast() -> None:
        for _ in range(6):
            started.append(await svc.wait_turn("fast"))
            await svc.advance("fast")

    task = asyncio.create_task(fast())
    # The fast worker runs iterations 0..s, then blocks at clock s+1 while slow is at 0.
    await wait_until(lambda: len(started) == staleness + 1)
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(started) == staleness + 1 and not task.done()
    # Each tick of the slow worker releases exactly one more iteration of the fast one.
    for n in range(1, 6 - staleness):
        await svc.tick("slow")  # slow is behind, so its own tick never waits
        await wait_until(lambda: len(started) == staleness + 1 + n)
    await asyncio.wait_for(task, 5)
    assert started == list(range(6))


async def test_tick_waits_and_removing_straggler_releases() -> None:
    svc = ClockService(0)
    await svc.add_worker("a")
    await svc.add_worker("b")
    tick_a = asyncio.create_task(svc.tick("a"))
    for _ in range(10):
        await asyncio.sleep(0)
    assert not tick_a.done()  # BSP: a finished clock 1, b has not
    await svc.remove_worker("b")
    assert await asyncio.wait_for(tick_a, 5) == 1
    # A new worker joining later starts at the current minimum, not at 0.
    assert await svc.add_worker("c") == 1
