"""When elastic steps run relative to a PS job's BSP clocks (EPS §3.3's barriers).

Two points in the BSP loop, both owned here:

- `overlap_epoch(fn)` runs fn alongside the running (or next) epoch's clocks and makes that epoch's
  end wait for it -- EPS's transmissions overlap training, and the barrier keeps them from
  overlapping the objective or a checkpoint;
- `at_boundary(fn)` runs fn at the next clock boundary, while no worker trains (a switch-over:
  input splits change hands with their place in the epoch, so every block is still trained once
  per epoch); `clock_boundary()` just waits for one (every worker flushed, so no request routed by
  an older ownership table is still in flight).

Each returns (fn's result, seconds training waited for it). The clock loop drives the scheduler
(`begin_epoch`, `run_boundary`, `end_epoch`, `close`); a step offered while no BSP loop runs gets
TrainingNotRunning. A boundary step calls `on_wanted` (the clock loop's: it ends the running clock
early, so the step waits about one mini-batch rather than the rest of a clock).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Optional, TypeVar
from protocol.errors import StateError

T = TypeVar("T")
Step = Callable[[], Awaitable[T]]


class TrainingNotRunning(StateError, RuntimeError):
    """An elastic step offered while no BSP training loop runs (not started, ended, or SSP)."""


class BoundaryScheduler:
    """Steps overlapping an epoch and steps at a clock boundary (see the module doc)."""

    def __init__(self, why_closed: Callable[[], Optional[str]], clock: Callable[[], float] = time.perf_counter) -> None:
        # None while the BSP loop accepts steps, else why not (the clock loop's state).
        self.why_closed = why_closed
        self.clock = clock
        self._in_epoch: Optional[list[asyncio.Task[None]]] = None     # steps overlapping the running epoch
        self._workers_done_at: Optional[float] = None                # when the running epoch's workers finished
        # Steps waiting for the next epoch / boundary: how to start each, and its caller's future.
        self._next_epoch: list[tuple[Callable[[], asyncio.Task[None]], asyncio.Future[Any]]] = []
        self._boundary: list[tuple[Callable[[], Awaitable[None]], asyncio.Future[Any]]] = []
        self.on_wanted: Optional[Callable[[], None]] = None     # a boundary step waits (module doc)

    # -- offered by the reconfiguration steps ------------------------------------------------------
    def _check(self) -> None:
        why = self.why_closed()
        if why is not None:
            raise TrainingNotRunning(why)

    async def overlap_epoch(self, fn: Step[T]) -> tuple[T, float]:
        """Run `fn` alongside the running epoch (or the next one, between epochs); that epoch ends
        only once `fn` is done."""
        self._check()
        fut: asyncio.Future[tuple[T, float]] = asyncio.get_running_loop().create_future()
        step = _StepRun()
        if self._in_epoch is not None:
            self._in_epoch.append(self._spawn(fn, fut, boundary=False, step=step))
        else:
            self._next_epoch.append((lambda: self._spawn(fn, fut, boundary=False, step=step), fut))
        return await _outcome(fut, step)

    async def at_boundary(self, fn: Step[T]) -> tuple[T, float]:
        """Run `fn` at the next clock boundary, while no worker trains."""
        self._check()
        fut: asyncio.Future[tuple[T, float]] = asyncio.get_running_loop().create_future()
        step = _StepRun()

        async def run() -> None:
            await self._spawn(fn, fut, boundary=True, step=step)
        self._boundary.append((run, fut))
        if self.on_wanted is not None:
            self.on_wanted()
        return await _outcome(fut, step)

    async def clock_boundary(self) -> None:
        """Wait for the next clock boundary; at once when training is not running (nothing is in
        flight then either)."""
        if self.why_closed() is not None:
            return
        try:
            await self.at_boundary(_nothing)
        except TrainingNotRunning:
            pass

    # -- driven by the clock loop --------------------------------------------------------------------
    @property
    def quiet(self) -> bool:
        """No step overlaps the running epoch now and none waits for a boundary: between two clocks
        nothing but training has touched the model (what a mid-epoch objective needs)."""
        return not self._boundary and all(t.done() for t in self._in_epoch or [])

    def begin_epoch(self) -> None:
        self._workers_done_at = None
        starters, self._next_epoch = self._next_epoch, []
        self._in_epoch = [start() for start, _ in starters]

    async def run_boundary(self) -> None:
        """Run the boundary steps offered so far, one after the other (no worker trains now)."""
        while self._boundary:
            pending, self._boundary = self._boundary, []
            for run, _ in pending:
                await run()

    async def end_epoch(self) -> None:
        """The epoch's workers are done: wait for the steps overlapping it."""
        self._workers_done_at = self.clock()
        steps, self._in_epoch = self._in_epoch or [], None
        await asyncio.gather(*steps, return_exceptions=True)

    async def abort_epoch(self) -> None:
        """The epoch failed: cancel the steps overlapping it."""
        steps, self._in_epoch = self._in_epoch or [], None
        for t in steps:
            t.cancel()
        await asyncio.gather(*steps, return_exceptions=True)

    def close(self) -> None:
        """Training ended: steps still waiting for an epoch or a boundary fail."""
        pending = [fut for _, fut in self._next_epoch] + [fut for _, fut in self._boundary]
        self._next_epoch, self._boundary = [], []
        for fut in pending:
            if not fut.done():
                fut.set_exception(TrainingNotRunning("training ended before the change could be made"))

    # -----------------------------------------------------------------------------------------------
    def _spawn(self, fn: Step[T], fut: "asyncio.Future[tuple[T, float]]", boundary: bool,
               step: "_StepRun") -> "asyncio.Task[None]":
        """Run a step; its future gets (result, seconds training waited for it): all of a boundary
        step, and of an overlapped step what it ran past its epoch's workers. A step whose caller
        gave up before its turn does not run (`_outcome`)."""
        async def run() -> None:
            if step.given_up:
                step.ended.set()
                return
            step.started = True
            try:
                await self._run_step(fn, fut, boundary)
            finally:
                step.ended.set()
        return asyncio.ensure_future(run())

    async def _run_step(self, fn: Step[T], fut: "asyncio.Future[tuple[T, float]]", boundary: bool) -> None:
        t0 = self.clock()
        try:
            result = await fn()
        except BaseException as e:  # noqa: BLE001 - the step's caller gets its error, training goes on
            if not fut.done():
                fut.set_exception(e)
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        now = self.clock()
        if boundary:
            lost = now - t0
        else:
            lost = now - self._workers_done_at if self._workers_done_at is not None else 0.0
        if not fut.done():
            fut.set_result((result, max(0.0, lost)))


class _StepRun:
    """Where one offered step is: not started, running, or ended; and whether its caller gave up."""

    def __init__(self) -> None:
        self.given_up = False
        self.started = False
        self.ended = asyncio.Event()


async def _outcome(fut: "asyncio.Future[T]", step: _StepRun) -> T:
    """The step's result for its caller. A caller that gives up (its change cancelled) drops a step
    that has not started; one that has started it waits for, so that when the cancellation reaches
    the controller the step has stopped changing the job (what the controller then reads of the
    job -- splits, ownership -- is what the step left). The step is not cancelled: a boundary step
    runs inside the clock loop, which its cancellation would end."""
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        step.given_up = True
        if step.started:
            await step.ended.wait()
            if fut.done() and not fut.cancelled():
                fut.exception()         # retrieved: its caller's own cancellation is what it reports
        else:
            fut.cancel()                # never to run: nothing (close()) completes it any more
        raise


async def _nothing() -> None:
    """A boundary step that only marks the boundary (see BoundaryScheduler.clock_boundary)."""
