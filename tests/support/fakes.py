"""The tests' shared fakes (in-process, no real daemons):

- FakeClock: a settable clock (`.t`, `advance`), starting where the test says (0 by default). rm_testing.FakeClock
  is the RM's own (it starts at the real time so signed tokens verify).
- FakeRM / FakeNM: the RM's AM API and the NM's container API for AM-library tests (conftest's `fake_cluster`);
  FakeNM accepts any "ctok-" token.
- FakeSignedNM: the NM's container API checking real signed container tokens (the RM API tests). Not merged with
  FakeNM: it verifies tokens against the cluster secret and records (claims, request) pairs.
- The RM's node API for NM process tests is nm_harness.FakeNodeRM (it runs beside a real NM process).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Optional

from aiohttp import web

from protocol import codec, http_server, tokens
from protocol import internal_api as api
from protocol.records import ContainerState, ExitStatus, Resource
from protocol.remote_exception import ApplicationMasterNotRegistered, NotFound, ServiceUnavailable, Unauthorized
from rm_testing import SECRET


class FakeClock:
    """A settable clock: call it for the time, set `.t` or `advance(dt)`."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


AM_TOKEN = "fake-am-token"


@dataclass
class FakeNM:
    """Minimal NM container API: accepts tokens starting with "ctok-", records what it launched."""

    address: str = ""
    started: dict[str, api.StartContainerRequest] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)
    refuse: bool = False
    complete_on_stop: bool = True

    def app(self) -> web.Application:
        app = http_server.make_app()
        app.router.add_post(api.CONTAINER_START, self._start)
        app.router.add_post("/internal/v1/containers/{cid}/stop", self._stop)
        return app

    def _check(self, request: web.Request) -> str:
        tok = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if self.refuse or not tok.startswith("ctok-"):
            raise Unauthorized("invalid container token")
        return tok

    async def _start(self, request: web.Request) -> web.Response:
        self._check(request)
        req = await http_server.read_json(request, api.StartContainerRequest)
        cid = req.container_token.removeprefix("ctok-")
        self.started[cid] = req
        return http_server.json_response(api.ContainerStatus(container_id=cid, state="RUNNING", pid=4242))

    async def _stop(self, request: web.Request) -> web.Response:
        self._check(request)
        cid = request.match_info["cid"]
        if cid not in self.started:
            raise NotFound(f"no container {cid}")
        self.stopped.append(cid)
        state = ContainerState.COMPLETE.value if self.complete_on_stop else ContainerState.RUNNING.value
        return http_server.json_response(api.ContainerStatus(
            container_id=cid, state=state, exit_status=ExitStatus.KILLED_BY_APPMASTER,
            diagnostics="stopped by the AM"))


@dataclass
class FakeRM:
    """The RM's AM API, scripted by the test: grants what is asked (when `grant`), queues completions."""

    nm: FakeNM
    address: str = ""
    grant: bool = True
    extra_grants: int = 0                 # grant this many containers nobody asked for (surplus)
    asks: dict[int, api.ResourceAsk] = field(default_factory=dict)
    requests: list[api.AllocateRequest] = field(default_factory=list)
    registered: Optional[api.AmRegisterRequest] = None
    register_calls: int = 0
    finished: Optional[api.AmFinishRequest] = None
    releases: list[str] = field(default_factory=list)
    completed: list[api.ContainerStatus] = field(default_factory=list)
    updated_nodes: list[api.NodeReport] = field(default_factory=list)
    directive: Optional[api.ShapeDirective] = None
    actions: list[str] = field(default_factory=list)   # next responses' actions, one per call
    fail_allocates: int = 0                            # answer this many allocates with HTTP 500
    # Answer this many allocates ApplicationMasterNotRegistered (an RM that restarted or took over),
    # and this many registrations 503 (no RM active yet).
    not_registered: int = 0
    unavailable_registers: int = 0
    seq: int = 1
    # An attempt that took containers over from the one before (keep-containers-across-application-
    # attempts): listed in its register reply.
    previous: list[api.AllocatedContainer] = field(default_factory=list)

    def app(self) -> web.Application:
        app = http_server.make_app()
        app.router.add_post(api.AM_REGISTER, self._register)
        app.router.add_post(api.AM_ALLOCATE, self._allocate)
        app.router.add_post(api.AM_FINISH, self._finish)
        return app

    def _auth(self, request: web.Request) -> None:
        if request.headers.get("Authorization") != f"Bearer {AM_TOKEN}":
            raise Unauthorized("invalid am token")

    async def _register(self, request: web.Request) -> web.Response:
        self._auth(request)
        self.register_calls += 1
        if self.unavailable_registers > 0:
            self.unavailable_registers -= 1
            err = ServiceUnavailable("no active ResourceManager yet")
            return web.json_response(err.body(), status=err.status)
        self.registered = await http_server.read_json(request, api.AmRegisterRequest)
        return http_server.json_response(api.AmRegisterResponse(
            app_id="application_1_0001", attempt_id="appattempt_1_0001_000001",
            maximum_resource=Resource(1024, 2), queue="default", user="alice",
            containers_from_previous_attempts=self.previous))

    def new_container(self, resource: Resource, ask_id: int = 0, tag: str = "") -> api.AllocatedContainer:
        self.seq += 1
        cid = f"container_1_0001_01_{self.seq:06d}"
        return api.AllocatedContainer(container_id=cid, node_id="n1:1", node_http_address=self.nm.address,
                                      resource=resource, container_token=f"ctok-{cid}", ask_id=ask_id, tag=tag)

    async def _allocate(self, request: web.Request) -> web.Response:
        self._auth(request)
        req = await http_server.read_json(request, api.AllocateRequest)
        self.requests.append(req)
        if self.not_registered > 0:
            self.not_registered -= 1
            nr = ApplicationMasterNotRegistered("appattempt_1_0001_000001 must register before it allocates")
            return web.json_response(nr.body(), status=nr.status)
        if self.fail_allocates > 0:
            self.fail_allocates -= 1
            return web.json_response({"RemoteException": {"exception": "Boom", "message": "x",
                                                          "javaClassName": "x"}}, status=500)
        for a in req.asks:
            self.asks[a.ask_id] = a
        self.releases.extend(req.releases)
        allocated = []
        if self.grant:
            for a in list(self.asks.values()):
                for _ in range(a.count):
                    allocated.append(self.new_container(a.resource, a.ask_id, a.tag))
                self.asks[a.ask_id] = msgspec_replace_count(a, 0)
        for _ in range(self.extra_grants):
            allocated.append(self.new_container(Resource(64, 1), ask_id=99))
        self.extra_grants = 0
        completed, self.completed = self.completed, []
        nodes, self.updated_nodes = self.updated_nodes, []
        action = self.actions.pop(0) if self.actions else "NORMAL"
        return http_server.json_response(api.AllocateResponse(
            response_id=req.response_id + 1, allocated=allocated, completed=completed,
            updated_nodes=nodes, shape_directive=self.directive, action=action,
            available=Resource(512, 1), num_cluster_nodes=1))

    async def _finish(self, request: web.Request) -> web.Response:
        self._auth(request)
        self.finished = await http_server.read_json(request, api.AmFinishRequest)
        return http_server.json_response(api.AmFinishResponse(unregistered=True))


def msgspec_replace_count(a: api.ResourceAsk, count: int) -> api.ResourceAsk:
    return codec.decode_as({**codec.to_builtins(a), "count": count}, api.ResourceAsk)


class FakeSignedNM:
    """An NM container API that checks the container token and records launches."""

    def __init__(self, secret: str = SECRET) -> None:
        self.secret = secret
        self.started: list[tuple[dict, api.StartContainerRequest]] = []
        self.stopped: list[str] = []                 # container ids a stop was asked for
        self.refuse = False
        # When set, a start waits for it before it answers (a start still on its way); `arrived`
        # is set when one is waiting.
        self.hold: asyncio.Event | None = None
        self.arrived = asyncio.Event()

    def app(self) -> web.Application:
        from protocol.http_server import json_response, make_app, read_json, require_token
        from protocol.remote_exception import Unauthorized

        async def start(request: web.Request) -> web.Response:
            claims = require_token(request, self.secret, tokens.CONTAINER)
            if self.refuse:
                raise Unauthorized("launch refused by the test")
            req = await read_json(request, api.StartContainerRequest)
            if self.hold is not None:
                self.arrived.set()
                await self.hold.wait()
            self.started.append((claims, req))
            return json_response(api.ContainerStatus(container_id=claims["container_id"], state="RUNNING"))

        async def stop(request: web.Request) -> web.Response:
            claims = require_token(request, self.secret, tokens.CONTAINER)
            cid = request.match_info["cid"]
            if claims["container_id"] != cid:
                raise Unauthorized(f"the token is not for {cid}")
            self.stopped.append(cid)
            return json_response(api.ContainerStatus(container_id=cid, state="COMPLETE"))

        app = make_app()
        app.router.add_post(api.CONTAINER_START, start)
        app.router.add_post(api.container_stop_path("{cid}"), stop)
        return app
