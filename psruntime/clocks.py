"""Synchronisation clocks for PS workers: BSP (staleness 0) and SSP (staleness bound s).

A worker's clock is the number of iterations (mini-batch rounds) it has finished. A worker whose
clock is c wants to run iteration c+1; it may do so only while c - min(all clocks) <= s.
With s = 0 (BSP, EPS Fig. 1) that means every worker has finished iteration c; with s > 0 (SSP)
the fastest worker can run at most s clocks ahead of the slowest.

`ClockTable` is the pure logic; `ClockService` adds the async wait. Workers can be added (with a
starting clock, e.g. the current minimum, so a new worker does not hold everyone back) and removed
at run time, as EPS's dependency update does with its clock lists.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


class ClockError(ValueError):
    """A clock operation on an unknown worker, a duplicate worker or a bad staleness."""


@dataclass
class ClockTable:
    """Per-worker clocks with a staleness bound; pure (no I/O, no waiting)."""

    staleness: int = 0
    clocks: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.staleness < 0:
            raise ClockError(f"staleness must be >= 0, got {self.staleness}")

    def add_worker(self, worker: str, start_clock: int | None = None) -> int:
        """Add a worker at `start_clock` (default: the current minimum); returns its clock."""
        if worker in self.clocks:
            raise ClockError(f"worker {worker!r} already has a clock")
        clock = self.min_clock() if start_clock is None else start_clock
        if clock < 0:
            raise ClockError(f"start clock must be >= 0, got {clock}")
        self.clocks[worker] = clock
        return clock

    def remove_worker(self, worker: str) -> None:
        if self.clocks.pop(worker, None) is None:
            raise ClockError(f"unknown worker {worker!r}")

    def min_clock(self) -> int:
        """The clock every worker has reached: what servers use as the model's clock."""
        return min(self.clocks.values(), default=0)

    def clock_of(self, worker: str) -> int:
        try:
            return self.clocks[worker]
        except KeyError:
            raise ClockError(f"unknown worker {worker!r}") from None

    def can_start_next(self, worker: str) -> bool:
        """May `worker` (at clock c) start iteration c+1 now?"""
        return self.clock_of(worker) - self.min_clock() <= self.staleness

    def tick(self, worker: str) -> int:
        """`worker` finished an iteration; returns its new clock."""
        self.clocks[worker] = self.clock_of(worker) + 1
        return self.clocks[worker]


class ClockService:
    """ClockTable plus `await wait_turn(worker)`, woken whenever the minimum clock can have moved."""

    def __init__(self, staleness: int = 0) -> None:
        self.table = ClockTable(staleness)
        self._changed = asyncio.Condition()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def add_worker(self, worker: str, start_clock: int | None = None) -> int:
        clock = self.table.add_worker(worker, start_clock)
        await self._notify()
        return clock

    async def remove_worker(self, worker: str) -> None:
        self.table.remove_worker(worker)
        await self._notify()  # a removed straggler may release everyone

    async def wait_turn(self, worker: str) -> int:
        """Block until `worker` may start its next iteration; returns its current clock."""
        async with self._changed:
            await self._changed.wait_for(lambda: worker not in self.table.clocks
                                         or self.table.can_start_next(worker))
        return self.table.clock_of(worker)

    async def advance(self, worker: str) -> int:
        """Finish an iteration without waiting (e.g. a worker that pushes, then computes locally)."""
        clock = self.table.tick(worker)
        await self._notify()
        return clock

    async def tick(self, worker: str) -> int:
        """Finish an iteration and wait until the next one may start; returns the new clock."""
        clock = await self.advance(worker)
        await self.wait_turn(worker)
        return clock
