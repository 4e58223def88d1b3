"""The NM's side of the NM <-> RM protocol: register (with retry), heartbeat, act on responses."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Optional, Sequence

import aiohttp

from protocol import codec, tokens
from protocol import internal_api as api
from protocol.ha_config import NO_HA, HAConfig
from protocol.http_client import JsonHttpClient, RemoteError
from protocol.rm_failover import rm_client
from protocol.records import ContainerState, ExitStatus, Resource

from .container_manager import ContainerManager
from .log_aggregation_service import LogAggregationService
from .node_health import HEALTHY

log = logging.getLogger(__name__)

REGISTER_BACKOFF_MIN_S = 0.1
REGISTER_BACKOFF_MAX_S = 5.0
_TRANSIENT = (aiohttp.ClientError, OSError, asyncio.TimeoutError, RemoteError, codec.DecodeError)


class RMLink:
    """Registration and the heartbeat loop; `run` returns when the RM says SHUTDOWN."""

    def __init__(self, rm_address: str, secret: str, node_id: str, http_address: str, capability: Resource,
                 rack: str, manager: ContainerManager, heartbeat_interval_ms: int, token_lifetime_s: float,
                 on_registered: Callable[[], None] = lambda: None, version: str = "",
                 utilization: Callable[[], Optional[api.NodeUtilization]] = lambda: None,
                 node_labels: Sequence[str] = (), log_aggregation: Optional[LogAggregationService] = None,
                 ha: HAConfig = NO_HA, health: Callable[[], api.NodeHealth] = lambda: HEALTHY):
        self.rm_address = rm_address
        self.secret = secret
        self.node_id = node_id
        self.http_address = http_address
        self.capability = capability
        self.rack = rack
        self.node_labels = list(node_labels)   # reported on registration (protocol/node_labels.py)
        self.manager = manager
        # The heartbeat period: nm.toml's until the RM answers, then the one each answer carries
        # (YARN's nextHeartBeatInterval): the RM times its node expiry and its grace periods by it.
        self.interval_s = heartbeat_interval_ms / 1000
        self.token_lifetime_s = token_lifetime_s
        self.on_registered = on_registered
        self.version = version
        self.utilization = utilization   # the latest sample (read only: sampling runs elsewhere)
        self.log_aggregation = log_aggregation   # None: cluster.toml has no remote_app_log_dir
        self.health = health             # the latest verdict (nodemanager/node_health.py; checks run elsewhere)
        # With cluster.toml's [ha], a client that moves on to the next listed RM when this one is
        # down or standby (protocol/rm_failover.py); the new active answers RESYNC and the node
        # registers with it.
        self.client: JsonHttpClient = rm_client(rm_address, ha, timeout_s=max(5.0, 3 * self.interval_s))
        self.response_id = 0
        self.registered = False
        self.last_heartbeat_ok: Optional[float] = None
        self._token: Optional[str] = None
        self._token_minted = 0.0
        # An out-of-band heartbeat (YARN's sendOutofBandHeartBeat): a container that ended is
        # reported now, not up to a heartbeat interval later -- the AM waits on that report to
        # recover from a lost executor.
        self._wake = asyncio.Event()
        manager.on_container_exited = self._wake.set

    def token(self) -> str:
        """The NM token, re-minted at half its lifetime."""
        now = time.time()
        if self._token is None or now - self._token_minted > self.token_lifetime_s / 2:
            self._token = tokens.sign(self.secret, tokens.NM, {"node_id": self.node_id}, self.token_lifetime_s)
            self._token_minted = now
        return self._token

    async def register(self) -> api.NodeRegisterResponse:
        """Register, retrying with backoff until the RM answers."""
        delay = REGISTER_BACKOFF_MIN_S
        warned = False
        while True:
            agg = self.log_aggregation
            reports = agg.all_reports() if agg is not None else []
            req = api.NodeRegisterRequest(node_id=self.node_id, http_address=self.http_address,
                                          capability=self.capability, rack=self.rack,
                                          containers=self.manager.statuses(with_role=True), version=self.version,
                                          node_labels=self.node_labels, applications=self.held_apps(),
                                          log_aggregation=reports)
            try:
                out = await self.client.post(api.NODE_REGISTER, req, token=self.token())
                resp = codec.decode_as(out, api.NodeRegisterResponse)
            except _TRANSIENT as e:
                if not warned:
                    log.warning("cannot register with the RM at %s (%s); retrying", self.rm_address, e)
                    warned = True
                await asyncio.sleep(delay)
                delay = min(REGISTER_BACKOFF_MAX_S, delay * 2)
                continue
            self.response_id = 0
            self.registered = True
            self._follow_interval(resp.heartbeat_interval_ms)
            if agg is not None and resp.action != "SHUTDOWN":
                agg.delivered(reports)
            log.info("registered with the RM at %s as %s (capability %s)", self.client.base_url, self.node_id,
                     self.capability.to_json())
            return resp

    def _follow_interval(self, interval_ms: int) -> None:
        """Heartbeat at the RM's period from now on (a value under 1 ms is no period: ignored)."""
        if interval_ms >= 1 and interval_ms / 1000 != self.interval_s:
            log.info("heartbeat interval %d ms, as the RM at %s says", interval_ms, self.client.base_url)
            self.interval_s = interval_ms / 1000

    def held_apps(self) -> list[str]:
        """The apps this node holds containers or not yet aggregated logs of (YARN's
        runningApplications): the RM answers those that are over with apps_to_cleanup."""
        held = {c.app_id for c in self.manager.containers.values()}
        if self.log_aggregation is not None:
            held.update(self.log_aggregation.held_apps())
        return sorted(held)

    async def run(self) -> None:
        """Register, then heartbeat until SHUTDOWN. Never gives up on an unreachable RM."""
        resp = await self.register()
        if resp.action == "SHUTDOWN":
            log.warning("the RM refused the registration: %s", resp.diagnostics)
            return
        self.on_registered()
        failures = 0
        while True:
            try:
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
            except asyncio.TimeoutError:
                pass
            self._wake.clear()      # before the heartbeat: an exit while it is on its way sends another
            statuses = self.manager.statuses()
            completed = [s.container_id for s in statuses if s.state == ContainerState.COMPLETE.value]
            reports = self.log_aggregation.pending_reports() if self.log_aggregation is not None else []
            req = api.NodeHeartbeatRequest(node_id=self.node_id, response_id=self.response_id,
                                           used=self.manager.used(), container_statuses=statuses,
                                           health=self.health(),
                                           utilization=self.utilization(), log_aggregation=reports)
            try:
                out = await self.client.post(api.NODE_HEARTBEAT, req, token=self.token())
                hb = codec.decode_as(out, api.NodeHeartbeatResponse)
            except _TRANSIENT as e:
                failures += 1
                if failures == 1 or failures % 30 == 0:
                    log.warning("heartbeat to %s failed (%d in a row): %s", self.rm_address, failures, e)
                if isinstance(e, RemoteError) and e.status in (401, 403, 404):
                    # The RM does not know us (e.g. it restarted without state): register again.
                    resp = await self.register()
                continue
            except Exception:  # a bug must not stop the heartbeats: the RM would declare the node LOST
                log.exception("heartbeat failed unexpectedly")
                continue
            failures = 0
            self.last_heartbeat_ok = time.time()
            self._follow_interval(hb.heartbeat_interval_ms)
            if hb.action == "SHUTDOWN":
                log.warning("the RM asked this node to shut down: %s", hb.diagnostics)
                return
            if hb.action == "RESYNC":
                # An RM that restarted, or took over as active, does not know this node: registering
                # again reports every running container, which it re-adopts for the attempts it kept.
                log.info("the RM at %s asked for a resync; registering again with %d containers",
                         self.client.base_url, len(statuses))
                resp = await self.register()
                if resp.action == "SHUTDOWN":
                    return
                continue
            if hb.response_id > req.response_id:
                # The RM has processed this heartbeat, so it has seen those completions.
                self.manager.mark_reported(completed)
            if reports and self.log_aggregation is not None:
                self.log_aggregation.delivered(reports)
            self.response_id = hb.response_id
            for cid in hb.containers_to_cleanup:
                self.manager.spawn_task(self.manager.stop(
                    cid, ExitStatus.KILLED_BY_RESOURCEMANAGER, "Container killed by the ResourceManager.",
                    wait=False))
            for app_id in hb.apps_to_cleanup:
                self.manager.spawn_task(self.manager.stop_app(app_id))

    async def close(self) -> None:
        await self.client.close()
