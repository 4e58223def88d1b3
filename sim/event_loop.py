"""The simulator's virtual clock: a heap of timed events, run in time order (no wall clock, no sleeps).

Time only moves forward, and only to the time of the next event: the clock the RM core reads is
`EventLoop.now`, so every timestamp the core records is an event time. Events at the same time
run in the order they were scheduled (a sequence number breaks ties), so a run is deterministic.
"""
from __future__ import annotations

import heapq
from typing import Callable, TypeVarTuple, Unpack

Ts = TypeVarTuple("Ts")


class EventLoop:
    """A virtual clock plus the events scheduled on it."""

    def __init__(self, start: float = 0.0):
        self.now = start
        # (time, sequence, fn, args): each entry's fn takes its args (at() checked that)
        self._heap: list[tuple[float, int, Callable[..., object], tuple[object, ...]]] = []
        self._seq = 0
        self.processed = 0

    def clock(self) -> float:
        """The current virtual time (pass this as the core's injected clock)."""
        return self.now

    def at(self, t: float, fn: Callable[[Unpack[Ts]], object], *args: Unpack[Ts]) -> None:
        """Run `fn(*args)` at virtual time `t` (never earlier than now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn, args))

    def after(self, dt: float, fn: Callable[[Unpack[Ts]], object], *args: Unpack[Ts]) -> None:
        self.at(self.now + max(0.0, dt), fn, *args)

    def __len__(self) -> int:
        return len(self._heap)

    def run(self, stop: Callable[[], bool], until: float = float("inf"),
            on_event: Callable[[], None] = lambda: None) -> None:
        """Run events in time order until `stop()` holds, none are left, or the next is past `until`;
        `on_event` runs after each event (the simulator drains the RM core's effects there)."""
        heap = self._heap
        while heap and not stop():
            t, _, fn, args = heap[0]
            if t > until:
                break
            heapq.heappop(heap)
            self.now = t
            self.processed += 1
            fn(*args)
            on_event()
