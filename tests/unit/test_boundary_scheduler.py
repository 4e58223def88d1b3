"""BoundaryScheduler (appmaster/ps/boundary_scheduler.py): a step whose caller gave up does not run,
or stops, so it changes nothing behind the rollback its caller's controller has started."""
from __future__ import annotations

import asyncio

import pytest

from appmaster.ps.boundary_scheduler import BoundaryScheduler


async def test_a_boundary_step_whose_caller_gave_up_never_runs() -> None:
    s = BoundaryScheduler(lambda: None)
    ran: list[str] = []

    async def step() -> str:
        ran.append("step")
        return "done"
    caller = asyncio.ensure_future(s.at_boundary(step))
    await asyncio.sleep(0)          # offered: waiting for the boundary
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await s.run_boundary()
    assert ran == []
    # A step offered after it runs as usual.
    result, waited = await asyncio.gather(s.at_boundary(step), s.run_boundary())
    assert result[0] == "done" and ran == ["step"]


async def test_an_overlapping_step_stops_when_its_caller_gives_up() -> None:
    s = BoundaryScheduler(lambda: None)
    s.begin_epoch()
    started, stopped = asyncio.Event(), asyncio.Event()

    async def step() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.set()
            raise
    caller = asyncio.ensure_future(s.overlap_epoch(step))
    await asyncio.wait_for(started.wait(), 5)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(stopped.wait(), 5)
    await s.end_epoch()             # the epoch's end does not wait for it any more
