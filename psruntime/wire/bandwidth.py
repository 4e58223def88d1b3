"""Network rates and the emulated link: tc-style rate parsing and a token bucket for the data plane.

A local cluster can cap each node's bandwidth (`elastane cluster start --node-bandwidth 1gbit`).
Where the machine allows it the cap is real (Linux tc on a network namespace per node, see
elastane_cli.node_network); elsewhere the NM passes the cap to its containers as
`ELASTANE_NODE_BANDWIDTH_BPS` (bits per second) and every data-plane connection of the process
paces its writes through one shared token bucket (`process_pacer`).

That emulation is per executor process, not per node: each container gets the whole rate for
its own egress, ingress is not capped, and traffic to co-located executors is paced like any
other. It makes communication cost grow with bytes moved, which is what the Cruise cost model
needs, but it is not a shared link.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from typing import Awaitable, Callable, Mapping

from protocol import container_env

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

# tc(8) units: a bare number and "bit" are bits per second, "bps" is BYTES per second.
_UNITS: dict[str, int] = {
    "": 1, "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
    "kibit": 2**10, "mibit": 2**20, "gibit": 2**30, "tibit": 2**40,
    "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9, "tbps": 8 * 10**12,
    "kibps": 8 * 2**10, "mibps": 8 * 2**20, "gibps": 8 * 2**30, "tibps": 8 * 2**40,
}
_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z]*)\s*$")
MIN_RATE_BPS = 8_000                 # 1 kB/s: below this nothing on the data plane ever finishes
MAX_RATE_BPS = 10**12 * 8            # 8 Tbit/s: beyond any NIC; guards against typos
DEFAULT_BURST_S = 0.004              # a token bucket holds 4 ms of traffic ...
MIN_BURST_BYTES = 64 << 10           # ... but at least one 64 KiB write


def parse_rate(value: str | int) -> int:
    """A rate as tc writes it ("100mbit", "1gbit", "12.5mbps", "1000000") -> bits per second.

    An int is taken as bits per second. Raises ValueError naming the bad value and the units.
    """
    if isinstance(value, bool):
        raise ValueError(f"bad rate {value!r}: expected e.g. 100mbit, 1gbit, 125mbps")
    if isinstance(value, int):
        bps = value
    else:
        m = _RATE_RE.match(str(value).lower())
        if m is None or m.group(2) not in _UNITS:
            raise ValueError(f"bad rate {value!r}: expected a number with a tc unit, e.g. 100mbit, 1gbit, "
                             f"125mbps (units: {', '.join(u for u in _UNITS if u)}; bps = bytes/s)")
        bps = round(float(m.group(1)) * _UNITS[m.group(2)])
    if not MIN_RATE_BPS <= bps <= MAX_RATE_BPS:
        raise ValueError(f"rate {value!r} = {bps} bit/s is out of range "
                         f"({format_rate(MIN_RATE_BPS)} .. {format_rate(MAX_RATE_BPS)})")
    return bps


def format_rate(bps: int) -> str:
    """Bits per second as a short tc-style string: 100000000 -> "100mbit"."""
    for unit, mult in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= mult and bps % mult == 0:
            return f"{bps // mult}{unit}"
    for unit, mult in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= mult:
            return f"{bps / mult:.3g}{unit}"
    return f"{bps}bit"


def default_burst_bytes(bps: int) -> int:
    """Burst for a bucket (or a tc tbf) at `bps`: 4 ms of traffic, at least 64 KiB."""
    return max(MIN_BURST_BYTES, int(bps / 8 * DEFAULT_BURST_S))


class TokenBucket:
    """A token bucket in bytes, pure arithmetic on an injected clock (no sleeping, no I/O).

    `reserve(n)` takes n tokens at once and may leave the bucket in debt; it returns how long the
    caller must wait before sending those n bytes. Because later reservations see the earlier
    debt, concurrent senders are served in reservation order and the long-run rate never
    exceeds `rate_bytes_s`, whatever the write sizes (a write larger than the burst is fine).
    """

    def __init__(self, rate_bytes_s: float, burst_bytes: int, clock: Clock = time.monotonic) -> None:
        if rate_bytes_s <= 0:
            raise ValueError(f"rate_bytes_s must be > 0, got {rate_bytes_s}")
        if burst_bytes <= 0:
            raise ValueError(f"burst_bytes must be > 0, got {burst_bytes}")
        self.rate = float(rate_bytes_s)
        self.burst = int(burst_bytes)
        self._clock = clock
        self._tokens = float(burst_bytes)   # starts full, like an idle link
        self._last = clock()

    @classmethod
    def for_rate(cls, bps: int, clock: Clock = time.monotonic) -> "TokenBucket":
        """A bucket for `bps` bits per second with the default burst."""
        return cls(bps / 8, default_burst_bytes(bps), clock)

    def _refill(self) -> None:
        now = self._clock()
        if now > self._last:
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
            self._last = now

    @property
    def tokens(self) -> float:
        """Tokens now (negative while in debt)."""
        self._refill()
        return self._tokens

    def reserve(self, nbytes: int) -> float:
        """Take `nbytes` tokens; return the seconds to wait before they may be sent (0 = now)."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        self._refill()
        self._tokens -= nbytes
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def charge(self, nbytes: int) -> None:
        """Count bytes already sent without waiting (small control frames): later writes pay."""
        self.reserve(nbytes)


class Pacer:
    """An asyncio front of a TokenBucket: `await acquire(n)` returns when n bytes may go out."""

    def __init__(self, bucket: TokenBucket, sleep: Sleep = asyncio.sleep) -> None:
        self.bucket = bucket
        self._sleep = sleep
        self.bytes_paced = 0

    @property
    def bps(self) -> int:
        return int(self.bucket.rate * 8)

    def delay_for(self, nbytes: int) -> float:
        """Reserve `nbytes` and return the wait (for callers that schedule the write themselves)."""
        self.bytes_paced += nbytes
        return self.bucket.reserve(nbytes)

    async def sleep(self, seconds: float) -> None:
        await self._sleep(seconds)

    async def acquire(self, nbytes: int) -> None:
        delay = self.delay_for(nbytes)
        if delay > 0:
            await self._sleep(delay)


def bandwidth_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """The emulated per-container cap from ELASTANE_NODE_BANDWIDTH_BPS, or None when unset / 0."""
    raw = (os.environ if environ is None else environ).get(container_env.NODE_BANDWIDTH_BPS, "").strip()
    if not raw or raw == "0":
        return None
    try:
        return parse_rate(int(raw))
    except ValueError:
        raise ValueError(f"{container_env.NODE_BANDWIDTH_BPS}={raw!r}: expected bits per second "
                         f"({format_rate(MIN_RATE_BPS)} .. {format_rate(MAX_RATE_BPS)})") from None


_process_pacer: Pacer | None = None
_process_pacer_read = False


def process_pacer() -> Pacer | None:
    """The one Pacer every data-plane connection of this process shares (None: no cap).

    Read once from the environment, so the whole process sees a single emulated link.
    """
    global _process_pacer, _process_pacer_read
    if not _process_pacer_read:
        try:
            bps = bandwidth_from_env()
        except ValueError as e:  # a bad value must not take the executor down: run uncapped, say so
            log.warning("ignoring the bandwidth cap: %s", e)
            bps = None
        _process_pacer = Pacer(TokenBucket.for_rate(bps)) if bps else None
        _process_pacer_read = True
    return _process_pacer
