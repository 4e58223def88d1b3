"""BoundaryScheduler (appmaster/ps/boundary_scheduler.py) when a step's caller gives up (its change
cancelled): a step not started yet never runs; a running one is not cancelled -- a boundary step
runs inside the clock loop, which its cancellation would end -- and the caller's cancellation
reaches the controller only once the step has ended, so what the controller then reads of the
job is what the step left."""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import pytest

from appmaster.ps.boundary_scheduler import BoundaryScheduler, Step


async def settle(steps: int = 10) -> None:
    """Let the event loop run a few steps (nothing here waits on time)."""
    for _ in range(steps):
        await asyncio.sleep(0)


async def test_a_boundary_step_whose_caller_gave_up_before_its_turn_never_runs() -> None:
    s = BoundaryScheduler(lambda: None)
    ran: list[str] = []

    async def step() -> str:
        ran.append("step")
        return "done"
    caller = asyncio.ensure_future(s.at_boundary(step))
    await settle()                  # offered: waiting for the boundary
    assert not s.quiet
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await s.run_boundary()          # the boundary comes: nothing runs, the loop goes on
    assert ran == []
    result, _ = await asyncio.gather(s.at_boundary(step), s.run_boundary())
    assert result[0] == "done" and ran == ["step"]


async def give_up_while_it_runs(offer: Callable[[Step], Awaitable[Any]]) -> list[str]:
    """Offer a step through `offer`, cancel its caller while it runs, then let it end: what ended
    first. The caller must still wait for the step it started."""
    started, release = asyncio.Event(), asyncio.Event()
    order: list[str] = []

    async def step() -> None:
        started.set()
        await release.wait()
        order.append("step ended")
    caller = asyncio.ensure_future(offer(step))
    await asyncio.wait_for(started.wait(), 5)
    caller.cancel()
    await settle()
    assert not caller.done()        # it waits for the step it started
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    order.append("caller cancelled")
    return order


async def test_a_running_boundary_step_ends_before_its_callers_cancellation_and_training_goes_on() -> None:
    s = BoundaryScheduler(lambda: None)
    boundary: list[asyncio.Future[None]] = []

    def offer(step: Step) -> Awaitable[Any]:
        offered = asyncio.ensure_future(s.at_boundary(step))     # offered before the boundary comes
        boundary.append(asyncio.ensure_future(s.run_boundary()))    # the clock loop at its boundary
        return offered
    assert await give_up_while_it_runs(offer) == ["step ended", "caller cancelled"]
    await boundary[0]               # the clock loop is not cancelled
    assert not boundary[0].cancelled()


async def test_a_running_overlapped_step_ends_before_its_callers_cancellation() -> None:
    s = BoundaryScheduler(lambda: None)
    s.begin_epoch()
    assert await give_up_while_it_runs(s.overlap_epoch) == ["step ended", "caller cancelled"]
    await s.end_epoch()
