"""Clients that fail over between the ResourceManagers cluster.toml's [ha] lists (YARN's
ConfiguredRMFailoverProxyProvider with RetryPolicies.failoverOnNetworkException).

A call goes to the RM that answered last; when that RM cannot be reached (connection refused or
reset, a connection not opened within `connect_timeout_s` or an answer that stops arriving for
`read_timeout_s` -- a host that went silent drops the SYNs, or never answers on a kept-alive
connection, and without them a call waited its whole timeout, 30 s for the CLI, before moving on
-- or the call's timeout) or answers 503 -- a standby's StandbyException -- the call moves on to the next
listed RM, round the list, pausing `sleep_s` after each full round, for at most `max_attempts`
moves; then the last error is raised. Any other answer, an error included, is the active's and is
returned as it is. A standby redirects client REST calls to the active itself (307), which aiohttp
follows; the NM and AM protocols are refused with 503 and fail over here.

Re-sending a call is safe for every RM call this is used for: reads, heartbeats and allocates carry
their own response ids, and a submission names its application id (a second copy of the same
submission is answered as the first was and changes nothing, as YARN's ClientRMService answers
it: rm/core.py `earlier_submission`).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Optional, Sequence

import aiohttp

from .ha_config import FAILOVER_CONNECT_TIMEOUT_S, FAILOVER_READ_TIMEOUT_S, HAConfig, normalized_url
from .http_client import Body, JsonHttpClient, RemoteError
from .json_types import JsonValue

log = logging.getLogger(__name__)


def is_failover_error(e: BaseException) -> bool:
    """Whether `e` means "try another RM": nothing answered, or a standby did."""
    if isinstance(e, RemoteError):
        return e.status == 503
    return isinstance(e, (aiohttp.ClientConnectionError, OSError, asyncio.TimeoutError))


class FailoverJsonClient(JsonHttpClient):
    """A JsonHttpClient over several RMs: same calls, moving to the next RM on a failover error.
    `base_url` is the RM the next call goes to."""

    def __init__(self, base_urls: Sequence[str], token: Optional[str] = None, timeout_s: float = 30.0,
                 user: Optional[str] = None, max_attempts: int = 15, sleep_s: float = 0.5,
                 connect_timeout_s: float = FAILOVER_CONNECT_TIMEOUT_S, read_timeout_s: float = FAILOVER_READ_TIMEOUT_S):
        if not base_urls:
            raise ValueError("FailoverJsonClient needs at least one RM URL")
        connect, read = min(connect_timeout_s, timeout_s), min(read_timeout_s, timeout_s)
        self.clients = [JsonHttpClient(u, token, timeout_s, user, connect_timeout_s=connect, read_timeout_s=read)
                        for u in base_urls]
        super().__init__(self.clients[0].base_url, token, timeout_s, user, connect_timeout_s=connect,
                         read_timeout_s=read)
        self.max_attempts = max_attempts
        self.sleep_s = sleep_s
        self.current = 0
        self.failovers = 0      # moves so far, for logs and tests

    async def request(self, method: str, path: str, body: Body = None,
                      params: dict[str, str] | None = None, token: str | None = None) -> JsonValue:
        moves = 0
        start = self.current
        while True:
            client = self.clients[self.current]
            try:
                return await client.request(method, path, body, params=params, token=token)
            except Exception as e:
                if not is_failover_error(e) or moves >= self.max_attempts:
                    raise
                moves += 1
                self.failovers += 1
                self.current = (self.current + 1) % len(self.clients)
                self.base_url = self.clients[self.current].base_url
                log.info("RM %s did not serve %s %s (%s); failing over to %s", client.base_url, method, path,
                         e, self.base_url)
                if self.current == start and self.sleep_s > 0:
                    await asyncio.sleep(self.sleep_s)   # a full round failed: back off before the next

    async def close(self) -> None:
        for c in self.clients:
            await c.close()


def rm_urls(preferred: str, ha: HAConfig) -> list[str]:
    """The RMs to try, `preferred` first (when it is one of them), then the others in rm_ids order;
    just `preferred` without HA."""
    first = normalized_url(preferred)
    if not ha.enabled:
        return [first]
    listed = ha.addresses()
    return [first] + [u for u in listed if u != first] if first in listed else listed


def rm_client(preferred: str, ha: HAConfig, token: Optional[str] = None, timeout_s: float = 30.0,
              user: Optional[str] = None) -> JsonHttpClient:
    """The client for RM calls: a plain JsonHttpClient without HA, a failover client with it."""
    if not ha.enabled:
        return JsonHttpClient(preferred, token, timeout_s, user)
    return FailoverJsonClient(rm_urls(preferred, ha), token, timeout_s, user, ha.failover_max_attempts,
                              ha.failover_sleep_s, ha.failover_connect_timeout_s, ha.failover_read_timeout_s)
