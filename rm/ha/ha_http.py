"""The HTTP face of RM high availability: the HA routes every RM of a pair serves, and the whole
of what a standby serves.

- `GET /ws/v1/cluster/ha`: this RM's role, the reason of its last change, the active's id and
  address, the term's epoch, the recent role changes (both states).
- `POST /ws/v1/cluster/ha/transition-to-standby` (cluster admins only): YARN's
  `rmadmin -transitionToStandby`; the RM gives the leader key up and stays out of the elections
  for its hold-off, so another RM takes over (`elastane rm transition-to-standby`). An RM that
  is not in the election (still starting, or stopping) answers 409 and switches nothing.
- A standby answers `/ws/v1/cluster/info` itself with `haState: STANDBY`, as YARN's does; every
  other client REST call and web page is redirected to the active (307, method and body kept, as
  YARN's RMWebAppFilter does); the NM and AM protocol (`/internal/...`) is refused with 503 and
  YARN's StandbyException, so their clients move on to the next RM. With no active known, 503.
"""
from __future__ import annotations

from typing import Any, Callable

from aiohttp import web

from protocol.config import ClusterConfig
from protocol.http_server import error_middleware, json_response
from protocol.remote_exception import Conflict, Forbidden, ServiceUnavailable

from protocol.client_auth import request_user
from .role import HaRole, HAState

HA_PATH = "/ws/v1/cluster/ha"
TRANSITION_TO_STANDBY_PATH = HA_PATH + "/transition-to-standby"


class HaEndpoints:
    """What the HA routes need of the RM process (rm/ha/ha_server.py `HaResourceManager`)."""

    def __init__(self, cluster: ClusterConfig, rm_id: str, role: Callable[[], HaRole],
                 active: Callable[[], tuple[str, str]], etcd_error: Callable[[], str],
                 transition_to_standby: Callable[[str], Any]):
        self.cluster = cluster
        self.rm_id = rm_id
        self.role = role                        # the elector's role machine, read only
        self.active = active                    # (active RM id, its address); ("", "") = none known
        self.etcd_error = etcd_error            # the last etcd failure, "" while etcd answers
        self.transition_to_standby = transition_to_standby

    # ----- what /ws/v1/cluster/info and /ws/v1/cluster/ha say -----------------------------------
    def info_fields(self) -> dict[str, Any]:
        """The HA part of clusterInfo (YARN's field names, plus Elastane's ha* details)."""
        role = self.role()
        active_id, active_url = self.active()
        err = self.etcd_error()
        return {"haState": role.state.yarn_name,
                "haZooKeeperConnectionState": f"etcd: {err}" if err else "etcd: CONNECTED",
                "rmStateStoreName": "org.elastane.rm.ha.EtcdStateStore",
                "haRmId": self.rm_id, "haActiveRmId": active_id, "haActiveAddress": active_url,
                "haEpoch": role.epoch, "haReason": role.reason}

    def status(self) -> dict[str, Any]:
        role = self.role()
        active_id, active_url = self.active()
        return {"ha": {"rmId": self.rm_id, "state": role.state.value, "haState": role.state.yarn_name,
                       "since": role.since, "reason": role.reason, "epoch": role.epoch,
                       "activeRmId": active_id, "activeAddress": active_url, "leaseSeconds": role.lease_s,
                       "etcdError": self.etcd_error(),
                       "history": [{"at": c.at, "from": c.old.value, "to": c.new.value, "event": c.event.value,
                                    "reason": c.reason} for c in role.history]}}

    # ----- handlers -----------------------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(HA_PATH, self.get_status)
        app.router.add_post(TRANSITION_TO_STANDBY_PATH, self.post_transition_to_standby)

    async def get_status(self, request: web.Request) -> web.Response:
        request_user(self.cluster, request)
        return json_response(self.status())

    async def post_transition_to_standby(self, request: web.Request) -> web.Response:
        user = request_user(self.cluster, request)
        if user not in self.cluster.admins:
            raise Forbidden(f"user {user} may not switch ResourceManagers (admins: {', '.join(self.cluster.admins)})")
        role = self.role()
        if role.state in (HAState.INITIALIZING, HAState.STOPPED):
            # Not in the election: nothing to give up, and the role machine has no such switch.
            raise Conflict(f"ResourceManager {self.rm_id} is {role.state.value} ({role.reason}): it takes no part "
                           f"in the election, so there is nothing to switch to standby")
        await self.transition_to_standby(f"transition-to-standby by {user}")
        return json_response(self.status())


class StandbyApp:
    """The aiohttp application a standby RM serves on the RM's port."""

    def __init__(self, endpoints: HaEndpoints, started_ms: Callable[[], int]):
        self.ha = endpoints
        self.started_ms = started_ms

    def build(self) -> web.Application:
        app = web.Application(middlewares=[error_middleware])
        for path in ("/ws/v1/cluster", "/ws/v1/cluster/", "/ws/v1/cluster/info"):
            app.router.add_get(path, self.info)
        self.ha.add_routes(app)
        app.router.add_route("*", "/{tail:.*}", self.elsewhere)
        return app

    async def info(self, request: web.Request) -> web.Response:
        request_user(self.ha.cluster, request)
        ts = self.started_ms()
        return json_response({"clusterInfo": {"id": ts, "startedOn": ts, "state": "STARTED",
                                              **self.ha.info_fields()}})

    async def elsewhere(self, request: web.Request) -> web.StreamResponse:
        active_id, active_url = self.ha.active()
        internal = request.path.startswith("/internal/")
        if active_url and not internal:
            raise web.HTTPTemporaryRedirect(active_url + request.path_qs)
        who = f"the active is {active_id} at {active_url}" if active_url else "no active ResourceManager is known"
        raise ServiceUnavailable(f"ResourceManager {self.ha.rm_id} is in standby state ({self.ha.role().reason}); "
                                 f"{who}")

