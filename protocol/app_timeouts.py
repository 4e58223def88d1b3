"""YARN's application timeouts on the wire: the LIFETIME type, its expiryTime format and a
submission's `application-timeouts` object -- what the RM (rm/app_lifetime.py) and its clients
(the CLI) read and write alike."""
from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Optional

from protocol.errors import ProtocolError
from protocol.json_types import JsonInObject

LIFETIME = "LIFETIME"       # the one timeout type YARN has
UNLIMITED = "UNLIMITED"     # expiryTime of an app without a lifetime (remainingTimeInSeconds -1)
# The latest expiryTime the API can write (the calendar's year 9999): a later expiry could be
# stored but not shown, so every page and reply naming the app would fail.
LATEST_EXPIRY = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc).timestamp()
# The earliest one (year 1 in UTC): an earlier time, such as 0001-01-01T00:00:00+14:00, has no
# UTC expiryTime, so even the error naming it could not be written.
EARLIEST_EXPIRY = datetime(1, 1, 1, tzinfo=timezone.utc).timestamp()
# The longest lifetime taken (a submission's, a queue's default or cap, the CLI's): 100 years,
# counted from any time before 9899 an expiry that can be written.
MAX_LIFETIME_S = 100 * 365 * 86400


class LifetimeError(ProtocolError, ValueError):
    """A lifetime or expiry that cannot be accepted (a request the RM refuses); the message names
    what is wrong."""


def format_expiry(expiry: Optional[float]) -> str:
    """YARN's expiryTime: ISO 8601 with milliseconds and a numeric zone (yyyy-MM-dd'T'HH:mm:ss.SSSZ),
    here in UTC; UNLIMITED for none."""
    if expiry is None:
        return UNLIMITED
    t = datetime.fromtimestamp(expiry, tz=timezone.utc)
    # The year by hand: strftime's %Y does not pad years before 1000 to four digits on glibc.
    return f"{t.year:04d}" + t.strftime("-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}+0000"


def parse_expiry(text: str) -> float:
    """An expiryTime as YARN takes it (ISO 8601 with a zone: ...+0530, +05:30 or Z) in epoch
    seconds; LifetimeError naming the expected form otherwise."""
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise LifetimeError(f"expiryTime {text!r} is not an ISO 8601 time such as "
                            f"2026-11-30T18:00:00.000+0000") from None
    if t.tzinfo is None:
        raise LifetimeError(f"expiryTime {text!r} has no time zone (add +0000 or Z)")
    expiry = t.timestamp()
    check_writable(expiry)
    return expiry


def check_writable(expiry: float) -> None:
    """LifetimeError unless `expiry` is a time an expiryTime can show (finite, in the years 1 to 9999 UTC)."""
    if not math.isfinite(expiry):
        raise LifetimeError(f"expiryTime must be a time, got {expiry}")
    if expiry < EARLIEST_EXPIRY:
        raise LifetimeError(f"expiryTime is before {format_expiry(EARLIEST_EXPIRY)}, the earliest time the API can show")
    if expiry > LATEST_EXPIRY:
        raise LifetimeError(f"expiryTime is after {format_expiry(LATEST_EXPIRY)}, the latest time the API can show")


def check_lifetime_s(seconds: int) -> None:
    """LifetimeError unless `seconds` is a lifetime this API takes: 1 .. MAX_LIFETIME_S."""
    if seconds <= 0:
        raise LifetimeError(f"the lifetime must be > 0 seconds, got {seconds}")
    if seconds > MAX_LIFETIME_S:
        raise LifetimeError(f"the lifetime must be at most {MAX_LIFETIME_S} seconds (100 years), got {seconds}")


def lifetime_timeouts(lifetime_s: int) -> JsonInObject:
    """A submission's `application-timeouts` for a LIFETIME of `lifetime_s` seconds."""
    return {"timeout": [{"type": LIFETIME, "value": lifetime_s}]}
