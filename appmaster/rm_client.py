"""The AM's client of the RM's internal AM API: register, allocate, finish (AM-token authenticated)."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Mapping

from protocol import codec, container_env
from protocol import internal_api as api
from protocol.http_client import JsonHttpClient
from protocol.rm_failover import FailoverJsonClient
from protocol.errors import ConfigurationError


class AmEnvironmentError(ConfigurationError, RuntimeError):
    """The AM was started without the environment the RM gives an AM container."""


@dataclass(frozen=True)
class AmIdentity:
    """What the RM put in the AM container's environment."""

    rm_address: str
    am_token: str
    attempt_id: str
    container_id: str = ""
    am_dir: str = ""
    job_secret: str = ""     # the attempt's job secret (data plane and control endpoints); "" if not given
    # With HA, every RM's URL (the launching RM first): calls fail over between them.
    rm_addresses: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "AmIdentity":
        env = os.environ if env is None else env
        missing = [k for k in (container_env.RM_ADDRESS, container_env.AM_TOKEN, container_env.APP_ATTEMPT_ID)
                   if not env.get(k)]
        if missing:
            raise AmEnvironmentError(f"not running as an ApplicationMaster: {', '.join(missing)} not set")
        return cls(rm_address=env[container_env.RM_ADDRESS], am_token=env[container_env.AM_TOKEN],
                   attempt_id=env[container_env.APP_ATTEMPT_ID],
                   container_id=env.get(container_env.CONTAINER_ID, ""),
                   am_dir=env.get(container_env.AM_DIR, ""), job_secret=env.get(container_env.JOB_SECRET, ""),
                   rm_addresses=tuple(u.strip() for u in env.get(container_env.RM_ADDRESSES, "").split(",")
                                      if u.strip()))


# An AM's per-call limit with several RMs (see RmClient): the NM's heartbeat uses the same 5 s.
HA_CALL_TIMEOUT_S = 5.0


class RmClient:
    """Typed calls to /internal/v1/am/*; raises protocol.http_client.RemoteError on HTTP errors.
    Given several RMs (HA), a call that finds its RM down or standby moves on to the next
    (protocol/rm_failover.py), so an AM follows a failover to the new active."""

    def __init__(self, identity: AmIdentity, timeout_s: float = 15.0):
        self.identity = identity
        self._http: JsonHttpClient
        if len(identity.rm_addresses) > 1:
            # A call to an RM whose host went silent (no RST) must give up well within the new
            # active's AM expiry (rm.toml am_expiry_s, 10 s by default, counted from its takeover
            # about a lease after the death): at 15 s the AM reached it only after its expiry and
            # the job was restarted. HA_CALL_TIMEOUT_S, as the NM's heartbeat does.
            self._http = FailoverJsonClient(list(identity.rm_addresses), token=identity.am_token,
                                            timeout_s=min(timeout_s, HA_CALL_TIMEOUT_S))
        else:
            self._http = JsonHttpClient(identity.rm_address, token=identity.am_token, timeout_s=timeout_s)

    @property
    def am_token(self) -> str:
        """The AM token the next call sends: the launch-time one until the RM rolls it."""
        return self.identity.am_token

    def use_am_token(self, token: str) -> None:
        """Send `token` from the next call on, to every RM (the RM rolls the AM token before it
        expires and hands the new one out in AllocateResponse.am_token)."""
        if token and token != self.identity.am_token:
            self.identity = replace(self.identity, am_token=token)

    @property
    def rm_url(self) -> str:
        """The RM the next call goes to."""
        return self._http.base_url

    # Every call names the current token itself: the clients' own (one per RM under HA) is the
    # launch-time one, which expires (rm.toml token_lifetime_s) while a long job still runs.
    async def register(self, req: api.AmRegisterRequest) -> api.AmRegisterResponse:
        return codec.decode_as(await self._http.post(api.AM_REGISTER, req, token=self.am_token),
                               api.AmRegisterResponse)

    async def allocate(self, req: api.AllocateRequest) -> api.AllocateResponse:
        resp = codec.decode_as(await self._http.post(api.AM_ALLOCATE, req, token=self.am_token),
                               api.AllocateResponse)
        self.use_am_token(resp.am_token)
        return resp

    async def finish(self, req: api.AmFinishRequest) -> api.AmFinishResponse:
        return codec.decode_as(await self._http.post(api.AM_FINISH, req, token=self.am_token),
                               api.AmFinishResponse)

    async def close(self) -> None:
        await self._http.close()
