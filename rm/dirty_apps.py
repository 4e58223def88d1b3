"""The apps whose records changed since the last store write, and which of them a request changed.

The core marks an app dirty when its record changes; the server writes the dirty apps at the next
flush. A client call, an AM's or an NM's, must not be answered OK while what it changed is not in
the store (an AM's finish confirmed, then lost at a failover). So a request's handling runs with
`tracking()`: every app marked dirty meanwhile, by this request alone (a context variable: one
per asyncio task, so concurrent requests do not see each other's), is collected, and the server
answers 503 when any of them is still dirty after the flush.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Optional

_TOUCHED: ContextVar[Optional[set[str]]] = ContextVar("elastane_rm_touched_apps", default=None)


class DirtyApps(set[str]):
    """A set of app ids whose `add` also records the id for the request being handled, if any."""

    def add(self, app_id: str) -> None:
        super().add(app_id)
        touched = _TOUCHED.get()
        if touched is not None:
            touched.add(app_id)


@contextmanager
def tracking() -> Iterator[set[str]]:
    """Collect the apps marked dirty within the block (in this task and what it awaits)."""
    touched: set[str] = set()
    token = _TOUCHED.set(touched)
    try:
        yield touched
    finally:
        _TOUCHED.reset(token)
