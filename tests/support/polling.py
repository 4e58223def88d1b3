"""The tests' one way to wait: poll a real condition until it holds or a deadline passes.

A readiness check, never a sleep standing in for one. On timeout both helpers raise an
AssertionError naming what was awaited and the condition's last value, so a failure says how far
things got. The deadline only bounds how long a broken run takes to fail: a test must not depend
on it being short or long.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any


def _timeout(what: str, timeout_s: float, last: Any) -> AssertionError:
    return AssertionError(f"{what}: not met within {timeout_s}s (last value: {last!r})")


def wait_until(cond: Callable[[], Any], timeout_s: float = 30.0, what: str = "condition",
               interval_s: float = 0.1) -> Any:
    """Call `cond` every `interval_s` until it returns a truthy value, and return that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = cond()
        if last:
            return last
        if time.monotonic() > deadline:
            raise _timeout(what, timeout_s, last)
        time.sleep(interval_s)


async def async_wait_until(cond: Callable[[], Any | Awaitable[Any]], timeout_s: float = 15.0,
                           what: str = "condition", interval_s: float = 0.02) -> Any:
    """`wait_until` for async tests: polls without blocking the event loop; `cond` may also
    return an awaitable, which is awaited for its value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        last = cond()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if loop.time() > deadline:
            raise _timeout(what, timeout_s, last)
        await asyncio.sleep(interval_s)
