"""One ResourceManager process of an HA cluster: standby until elected, then active, and back.

The standby holds no RM state: it serves `ha_http.StandbyApp` on the RM's port (cluster info with
haState STANDBY, redirects to the active, 503 to NMs and AMs) and takes part in the election
(rm/ha/elector.py). Elected, it stops the standby app, builds a whole ResourceManagerServer
(`HaActiveServer`) on the fenced etcd state store of its term -- which recovers every app from
the store, as an RM restart does -- and serves on the same port. Stepping down (fenced, lease run
out, an operator's switch) stops that server and serves the standby app again: a fresh term
starts from the store, never from memory a deposed RM may hold stale (YARN's RM likewise
re-initialises its active services on every transition to active).
"""
from __future__ import annotations

import logging
import socket
import time
from typing import Any, Callable, Optional, Sequence
from urllib.parse import urlsplit

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler

from protocol.config import ClusterConfig, ConfigError, RMConfig
from protocol.http_server import json_response
from protocol.remote_exception import ServiceUnavailable
from protocol.ha_config import HAConfig

from ..server import ResourceManagerServer
from .elector import Elector
from .etcd_kv import BlockingEtcd, check_members
from .etcd_store import EtcdStateStore
from .ha_http import HA_PATH, HaEndpoints, StandbyApp

log = logging.getLogger(__name__)


def etcd_can_serve(listed: int, unanswered: int) -> bool:
    """Whether an RM starts with `unanswered` of the `listed` etcd members silent at its start:
    while most of them answer -- etcd itself serves only with a majority of its members up -- one
    down for maintenance is no reason to stop (docs/operating.md, "Settings"); fewer, and the
    list is more likely wrong than etcd briefly down."""
    return 2 * (listed - unanswered) > listed


class HaActiveServer(ResourceManagerServer):
    """The RM of one active term: the plain server on the term's fenced store, with the HA routes
    and the HA fields of /ws/v1/cluster/info."""

    def __init__(self, cfg: RMConfig, cluster: ClusterConfig, store: EtcdStateStore, endpoints: HaEndpoints,
                 epoch: int, may_act: Callable[[], bool], rm_urls: Sequence[str] = ()):
        super().__init__(cfg, cluster, store=store)
        self.rm_urls = list(rm_urls)        # AMs fail over between them (rm/am_launcher.py)
        self.ha_endpoints = endpoints
        self.epoch = epoch
        self.core.container_epoch = epoch   # before any node registers: every container of the term
        self.may_act = may_act      # the elector's check: leadership held and the lease not run out

    def build_app(self) -> web.Application:
        app = super().build_app()
        self.ha_endpoints.add_routes(app)
        app.middlewares.insert(0, self._guard)     # outermost: nothing runs for a deposed RM
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A request that reaches an RM whose lease has run out (it was paused, or lost etcd) is
        refused as a standby would refuse it, and the RM steps down, before anything is served."""
        if request.path.startswith(HA_PATH) or self.may_act():
            return await handler(request)
        err = ServiceUnavailable(f"ResourceManager {self.ha_endpoints.rm_id} is no longer active "
                                 f"({self.ha_endpoints.role().reason})")
        return json_response(err.body(), status=err.status)

    def flush(self) -> None:
        """Store writes and AM launches only while this RM may act as active (the store's fencing
        refuses the writes of a deposed RM anyway; this keeps its launches back too)."""
        if self.may_act():
            super().flush()

    def may_launch(self) -> bool:
        """Asked again after the flush's writes: one that found this RM fenced, or that outlasted
        its lease, launches none of the AMs it was to (the next active recovers those attempts)."""
        return super().may_launch() and self.may_act()

    @property
    def ha_info(self) -> Optional[dict[str, Any]]:
        return self.ha_endpoints.info_fields()


class HaResourceManager:
    """`await start()`: check the settings and etcd, serve as standby, join the election;
    `await stop()`: leave it (giving the leader key up) and shut down cleanly."""

    def __init__(self, cfg: RMConfig, cluster: ClusterConfig, ha: HAConfig, rm_id: str,
                 clock: Callable[[], float] = time.time):
        self.ha = ha
        self.rm_id = rm_id
        self.url = ha.address_of(rm_id)
        listed_port = urlsplit(self.url).port or 80
        if cfg.port == 0:
            cfg = msgspec.structs.replace(cfg, port=listed_port)
        elif cfg.port != listed_port:
            raise ConfigError(f"rm_addresses.{rm_id}: {self.url} names port {listed_port}, but this RM would serve "
                              f"port {cfg.port} (rm.toml's port or --port)")
        self.cfg = cfg
        # AMs this RM launches, and its ready file, name its own listed address.
        self.cluster = msgspec.structs.replace(cluster, rm_address=self.url)
        # The secret itself stays here: the elector keeps only its fingerprint, to check that
        # every RM of the cluster runs with the same one (rm/ha/elector.py).
        self.elector = Elector(ha, rm_id, self._become_active, self._become_standby,
                               cluster_secret=self.cluster.secret)
        self.endpoints = HaEndpoints(self.cluster, rm_id, lambda: self.elector.role, self.active_rm,
                                     lambda: self.elector.etcd_error, self.elector.transition_to_standby)
        self.active: Optional[HaActiveServer] = None
        self._standby: Optional[web.AppRunner] = None
        self._stopping = False
        self._started_ms = int(clock() * 1000)
        # Store writes block the loop (they are acknowledged writes): one member's wait is bounded
        # by a third of the lease. The lease's renewals wait meanwhile (rm/ha/elector.py bounds its
        # own calls tighter, at a sixth).
        self.store_timeout_s = max(0.5, ha.lease_s / 3)

    def active_rm(self) -> tuple[str, str]:
        """(id, address) of the active RM as last seen; this RM's own id only while it serves as
        active (a standby must not redirect to itself)."""
        active_id = self.elector.active_id
        if not active_id or active_id not in self.ha.rm_addresses:
            return "", ""
        if active_id == self.rm_id and self.active is None:
            return active_id, ""
        return active_id, self.ha.address_of(active_id)

    # ----- start / stop -----------------------------------------------------------------------
    def check_address(self) -> None:
        """The listed address must be this host's: its name resolves to an address this host can
        bind (so an RM started with another RM's id stops here, naming the setting)."""
        host = urlsplit(self.url).hostname or ""
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError as e:
            raise ConfigError(f"rm_addresses.{self.rm_id}: {host!r} does not resolve: {e}") from None
        for family, _, _, _, addr in infos:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                try:
                    s.bind((addr[0], 0))
                    return
                except OSError:
                    continue
        raise ConfigError(f"rm_addresses.{self.rm_id}: {self.url} is not an address of this host "
                          f"(is this RM's id {self.rm_id!r} right?)")

    async def start(self) -> str:
        self.check_address()
        targets = self.ha.etcd_targets()
        bad = await check_members(targets, timeout_s=max(1.0, self.ha.lease_s / 2))
        if not etcd_can_serve(len(targets), len(bad)):
            raise ConfigError(f"etcd_endpoints: no answer from {'; '.join(bad)} "
                              f"({len(targets) - len(bad)} of {len(targets)} answered: etcd needs a majority)")
        if bad:
            log.warning("etcd_endpoints: no answer from %s; starting, %d of %d members answered "
                        "(the elector moves to the next member when one does not answer)",
                        "; ".join(bad), len(targets) - len(bad), len(targets))
        await self._serve_standby()
        self.elector.start()
        log.info("ResourceManager %s serving on %s:%d as standby (%s); etcd %s", self.rm_id, self.cfg.host,
                 self.cfg.port, self.url, ", ".join(self.ha.etcd_endpoints))
        return self.url

    async def stop(self) -> None:
        self._stopping = True
        await self.elector.stop()
        if self.active is not None:
            await self._stop_active()
        await self._stop_standby()
        log.info("ResourceManager %s stopped", self.rm_id)

    # ----- role changes (the elector's callbacks, run one at a time) --------------------------
    async def _become_active(self, epoch: int, token: int) -> None:
        # The term's own callbacks: this server may outlive the term (its teardown waits for the
        # requests in flight) and must then neither act nor fence a newer term of this RM.
        store = EtcdStateStore(BlockingEtcd(self.ha.etcd_targets(), self.store_timeout_s), self.elector.keys,
                               token, self.elector.fenced_for(token))
        await self._stop_standby()
        try:
            server = HaActiveServer(self.cfg, self.cluster, store, self.endpoints, epoch,
                                    self.elector.may_act_for(token), self.ha.addresses())
            await server.start()
        except BaseException:
            store.close()
            if not self._stopping:
                await self._serve_standby()
            raise
        self.active = server
        log.warning("ResourceManager %s is active (epoch %d, %d applications recovered)", self.rm_id, epoch,
                    len(server.core.apps))

    async def _become_standby(self, reason: str) -> None:
        if self.active is not None:
            await self._stop_active()
        if not self._stopping and self._standby is None:
            await self._serve_standby()
        log.warning("ResourceManager %s is standby: %s", self.rm_id, reason)

    async def _stop_active(self) -> None:
        server, self.active = self.active, None
        if server is not None:
            await server.stop()

    async def _serve_standby(self) -> None:
        runner = web.AppRunner(StandbyApp(self.endpoints, lambda: self._started_ms).build(), access_log=None,
                               handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, self.cfg.host, self.cfg.port, reuse_address=True).start()
        self._standby = runner

    async def _stop_standby(self) -> None:
        runner, self._standby = self._standby, None
        if runner is not None:
            await runner.cleanup()
