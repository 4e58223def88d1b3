"""YARN's application lifetime (ApplicationTimeoutType LIFETIME, RMAppLifetimeMonitor): an app
that has not finished by its expiry is killed by the RM.

Pure: expiries are epoch seconds, `now` arrives as an argument. The lifetime counts from the
app's submission (YARN's rule); a queue may give apps a default lifetime and cap it
(`QueueConfig.default_app_lifetime_s` / `max_app_lifetime_s`, YARN's default- and
maximum-application-lifetime): an app asking for none, or for more than the cap, gets the cap.
An owner or admin moves the expiry (PUT /ws/v1/cluster/apps/{id}/timeout, `elastane app
update-lifetime`), to a time still ahead and, under a capped queue, within the cap.
"""
from __future__ import annotations

import heapq
from typing import Optional

from protocol.app_timeouts import LifetimeError, check_writable, format_expiry

TIMED_OUT_DIAGNOSTICS = "Application is killed by ResourceManager as Application is timed out."


def effective_lifetime(requested_s: Optional[int], default_s: int, max_s: int) -> Optional[int]:
    """The lifetime an app submitted to a queue gets, in seconds (None: unlimited). A queue's
    default and cap count only when > 0, as YARN's."""
    lifetime = requested_s if requested_s is not None and requested_s > 0 else None
    if lifetime is None and default_s > 0:
        lifetime = default_s
    if max_s > 0 and (lifetime is None or lifetime > max_s):
        lifetime = max_s
    return lifetime


def check_new_expiry(expiry: float, now: float, submit_time: float, max_s: int) -> None:
    """An update's expiry: still ahead of now, and within the queue's cap counted from the
    submission (LifetimeError naming the limit)."""
    check_writable(expiry)
    if expiry <= now:
        raise LifetimeError(f"expiryTime {format_expiry(expiry)} is not after the current time {format_expiry(now)}")
    if max_s > 0 and expiry - submit_time > max_s:
        raise LifetimeError(f"expiryTime {format_expiry(expiry)} is beyond the queue's maximum lifetime of "
                            f"{max_s} s from submission (at most {format_expiry(submit_time + max_s)})")


def remaining_s(expiry: Optional[float], now: float, final: bool) -> int:
    """remainingTimeInSeconds: -1 without a lifetime, 0 once the app is over or the time is up."""
    if expiry is None:
        return -1
    return 0 if final else max(0, int(expiry - now))


class LifetimeMonitor:
    """Which apps' lifetimes are up: a heap of (expiry, app id), with the current expiry per app
    (an entry whose expiry was moved since it was pushed is skipped when it surfaces)."""

    def __init__(self) -> None:
        self._expiry: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []

    def set(self, app_id: str, expiry: Optional[float]) -> None:
        if expiry is None:
            self._expiry.pop(app_id, None)
            return
        self._expiry[app_id] = expiry
        heapq.heappush(self._heap, (expiry, app_id))

    def forget(self, app_id: str) -> None:
        self._expiry.pop(app_id, None)

    def due(self, now: float) -> list[str]:
        """The apps whose expiry is at or before `now`, each once, forgotten here."""
        out: list[str] = []
        while self._heap and self._heap[0][0] <= now:
            expiry, app_id = heapq.heappop(self._heap)
            if self._expiry.get(app_id) == expiry:
                del self._expiry[app_id]
                out.append(app_id)
        if len(self._heap) > 2 * len(self._expiry) + 64:     # moved or forgotten entries pile up
            self._heap = [(e, a) for a, e in self._expiry.items()]
            heapq.heapify(self._heap)
        return out

    def __len__(self) -> int:
        return len(self._expiry)
