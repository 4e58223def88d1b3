"""Jobs that outlive a token: the RM rolls the AM token in the allocate response (as YARN rolls
AMRMTokens) and the AM's RM client switches to it; the NM lets an AM stop and watch a container it
runs with that container's token past its expiry, while a start still needs an unexpired one."""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, AsyncIterator

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from appmaster.am_client import ApplicationMaster
from appmaster.rm_client import AmIdentity, RmClient
from nm_harness import SECRET as NM_SECRET, container_token, new_ids
from nodemanager.container_manager import ContainerManager
from nodemanager.container_state import NMContainerState as S
from nodemanager.enforcement import Enforcement
from nodemanager.recovery_store import RecoveryStore
from nodemanager.web_api import NodeWebApi
from polling import async_wait_until
from protocol import internal_api as api
from protocol import tokens
from protocol.config import NMConfig
from protocol.records import AppState, AttemptState, ExitStatus, Resource
from rm_testing import SECRET, FakeClock, make_core, register, submit
from test_rm_api import close_env, make_env

HOUR = 3600.0


def test_an_am_allocating_for_two_days_gets_fresh_tokens_and_keeps_allocating_with_them():
    clock = FakeClock()
    core = make_core(clock)
    lifetime = core.cluster.token_lifetime_s
    assert lifetime == 24 * HOUR
    register(core, "n1:1")
    app_id = submit(core)
    (eff,) = core.take_effects()
    core.am_launched(eff.attempt_id)
    launch_token = token = eff.am_token
    core.am_register(tokens.verify(SECRET, token, tokens.AM, now=clock()), api.AmRegisterRequest())
    resp = core.allocate(tokens.verify(SECRET, token, tokens.AM, now=clock()), api.AllocateRequest(response_id=0))
    assert getattr(resp, "am_token", "") == ""   # a young token is not rolled
    rolled = []
    for hour in range(1, 49):
        clock.advance(HOUR)
        # What the RM's handler does with the token the AM sends: refused once expired.
        claims = tokens.verify(SECRET, token, tokens.AM, now=clock())
        resp = core.allocate(claims, api.AllocateRequest(response_id=resp.response_id, progress=0.5))
        assert resp.action == "NORMAL"
        if getattr(resp, "am_token", ""):       # (getattr: the old code's refusal is what fails)
            new = tokens.verify(SECRET, resp.am_token, tokens.AM, now=clock())
            assert {k: new[k] for k in ("app_id", "attempt_id", "user")} == \
                {k: claims[k] for k in ("app_id", "attempt_id", "user")}
            assert new["exp"] == pytest.approx(clock() + lifetime)
            rolled.append(hour)
            token = resp.am_token
    assert rolled == [12, 24, 36, 48]            # at half of each token's lifetime
    with pytest.raises(tokens.TokenError, match="expired"):
        tokens.verify(SECRET, launch_token, tokens.AM, now=clock())
    app = core.apps[app_id]
    assert app.state == AppState.RUNNING and core.attempts[app.current_attempt].state == AttemptState.RUNNING
    assert app.current_attempt == eff.attempt_id


def test_a_replayed_allocate_answers_the_same_rolled_token_and_the_previous_stays_valid():
    clock = FakeClock()
    core = make_core(clock)
    register(core, "n1:1")
    submit(core)
    (eff,) = core.take_effects()
    core.am_launched(eff.attempt_id)
    claims = tokens.verify(SECRET, eff.am_token, tokens.AM, now=clock())
    core.am_register(claims, api.AmRegisterRequest())
    clock.advance(13 * HOUR)
    first = core.allocate(claims, api.AllocateRequest(response_id=0))
    assert first.am_token
    assert core.allocate(claims, api.AllocateRequest(response_id=0)).am_token == first.am_token   # a retry
    # The AM missed it and goes on with the old token (still valid): it gets one again.
    clock.advance(HOUR)
    again = core.allocate(tokens.verify(SECRET, eff.am_token, tokens.AM, now=clock()),
                          api.AllocateRequest(response_id=first.response_id))
    assert again.am_token and again.action == "NORMAL"


async def test_the_rm_client_switches_to_the_rolled_token_and_allocates_past_a_day_over_http(tmp_path, monkeypatch):
    env = await make_env(tmp_path)
    # The RM's handler verifies tokens by the wall clock: let it read the core's (moved) clock.
    monkeypatch.setattr(tokens, "time", SimpleNamespace(time=env.clock))
    rm = None
    try:
        await env.register_node("n1:1")
        app_id = await env.submit(elastane={})
        launch_token = await env.launch_am()
        attempt_id = str(tokens.verify(SECRET, launch_token, tokens.AM)["attempt_id"])
        rm = RmClient(AmIdentity(rm_address=str(env.client.make_url("")).rstrip("/"), am_token=launch_token,
                                 attempt_id=attempt_id))
        await rm.register(api.AmRegisterRequest(tracking_url="http://am:7"))
        resp = await rm.allocate(api.AllocateRequest(response_id=0, progress=0.1))
        assert getattr(resp, "am_token", "") == ""
        env.clock.advance(13 * HOUR)
        resp = await rm.allocate(api.AllocateRequest(response_id=resp.response_id, progress=0.2))
        env.clock.advance(11.5 * HOUR)          # 24.5 h after launch: the launch token has expired
        # The old code's failure: this allocate was refused ("invalid am token: token expired").
        after_a_day = await rm.allocate(api.AllocateRequest(response_id=resp.response_id, progress=0.3))
        assert after_a_day.action == "NORMAL" and after_a_day.am_token == ""     # not due again yet
        assert resp.am_token and rm.am_token == resp.am_token != launch_token
        assert rm.identity.am_token == resp.am_token
        refused = await env.call("POST", api.AM_ALLOCATE, {"response_id": after_a_day.response_id, "progress": 0.3},
                                 token=launch_token, status=401)
        assert "token expired" in refused["RemoteException"]["message"]
        assert (await env.app(app_id))["state"] == "RUNNING"
    finally:
        if rm is not None:
            await rm.close()
        await close_env(env)


class FakeRm:
    """An RM that records the bearer token of each AM call; `down` answers 503 (a standby)."""

    def __init__(self, roll_to: str = ""):
        self.roll_to = roll_to
        self.down = False
        self.seen: list[tuple[str, str | None]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(api.AM_ALLOCATE, self.allocate)
        app.router.add_post(api.AM_FINISH, self.finish)
        return app

    def _record(self, request: web.Request) -> None:
        self.seen.append((request.path, tokens.token_from_header(request.headers.get("Authorization"))))
        if self.down:
            raise web.HTTPServiceUnavailable(text='{"RemoteException": {"exception": "StandbyException", '
                                                  '"message": "standby"}}', content_type="application/json")

    async def allocate(self, request: web.Request) -> web.Response:
        self._record(request)
        body = await request.json()
        resp = api.AllocateResponse(response_id=body["response_id"] + 1, am_token=self.roll_to)
        return web.json_response(msgspec.to_builtins(resp))

    async def finish(self, request: web.Request) -> web.Response:
        self._record(request)
        return web.json_response({"unregistered": True})


@pytest.fixture
async def two_rms() -> AsyncIterator[tuple[FakeRm, FakeRm, list[str]]]:
    a, b = FakeRm(roll_to="rolled-by-b"), FakeRm(roll_to="rolled-by-b")
    servers = [TestServer(a.app(), host="127.0.0.1"), TestServer(b.app(), host="127.0.0.1")]
    for s in servers:
        await s.start_server()
    try:
        yield a, b, [f"http://127.0.0.1:{s.port}" for s in servers]
    finally:
        for s in servers:
            await s.close()


async def test_the_ha_rm_client_sends_the_rolled_token_to_every_rm_and_the_am_keeps_it(two_rms: Any):
    a, b, urls = two_rms
    identity = AmIdentity(rm_address=urls[0], am_token="launch", attempt_id="appattempt_1_0001_000001",
                          rm_addresses=tuple(urls))
    rm = RmClient(identity)
    am = ApplicationMaster(identity, rm_client=rm)
    try:
        a.down = True                               # the first RM is a standby: the call fails over
        resp = await rm.allocate(api.AllocateRequest(response_id=0))
        assert resp.am_token == "rolled-by-b" and rm.am_token == "rolled-by-b"
        assert a.seen[-1][1] == "launch" and b.seen[-1][1] == "launch"
        await am.on_allocate_response(resp)
        assert am.identity.am_token == "rolled-by-b" and am.identity.attempt_id == identity.attempt_id
        a.down, b.down, a.roll_to = False, True, ""  # fail back over to the first RM
        await rm.allocate(api.AllocateRequest(response_id=1))
        assert b.seen[-1][1] == "rolled-by-b" and a.seen[-1][1] == "rolled-by-b"
        assert rm.am_token == "rolled-by-b"        # an answer without a token keeps the current one
        await rm.finish(api.AmFinishRequest(final_status="SUCCEEDED"))
        assert a.seen[-1] == (api.AM_FINISH, "rolled-by-b")
    finally:
        await am.nm.close()
        await rm.close()


def _expired_container_token(node_id: str, cid: str, app: str, attempt: str, secret: str = NM_SECRET) -> str:
    """The token the RM signed for `cid` a day ago (lifetime one hour): authentic, expired."""
    from protocol.nm_client import container_token_payload  # noqa: PLC0415
    payload = container_token_payload(cid, node_id, app, attempt, "alice", Resource(128, 1))
    return tokens.sign(secret, tokens.CONTAINER, payload, HOUR, now=time.time() - 24 * HOUR)


async def test_the_nm_stops_and_reports_a_running_container_with_its_expired_token_but_starts_none(tmp_path):
    node = "127.0.0.1:1"
    cfg = NMConfig(local_dir=str(tmp_path / "local"), log_dir=str(tmp_path / "logs"),
                   recovery_dir=str(tmp_path / "rec"))
    m = ContainerManager(cfg, node, "127.0.0.1", 1, Resource(1024, 2), Enforcement(None),
                         RecoveryStore(cfg.recovery_dir))
    web_api = NodeWebApi(m, NM_SECRET, node, lambda: "http://" + node, lambda: {"id": node})
    app, attempt, cid = new_ids()
    other_app, other_attempt, other_cid = new_ids()
    try:
        async with TestClient(TestServer(web_api.app())) as cl:
            body = {"container_token": container_token(node, cid, app, attempt), "launch_context":
                    {"commands": ["sleep 30"]}}
            r = await cl.post(api.CONTAINER_START, json=body)
            assert r.status == 200, await r.text()
            c = m.containers[cid]
            await async_wait_until(lambda: c.state is S.RUNNING, what=f"{cid} running")
            expired = _expired_container_token(node, cid, app, attempt)
            with pytest.raises(tokens.TokenError, match="expired"):
                tokens.verify(NM_SECRET, expired, tokens.CONTAINER)

            # A start with an expired token is refused, and starts nothing.
            late = _expired_container_token(node, other_cid, other_app, other_attempt)
            r = await cl.post(api.CONTAINER_START, json={"container_token": late,
                                                         "launch_context": {"commands": ["true"]}})
            assert r.status == 401 and "expired" in (await r.json())["RemoteException"]["message"]
            assert other_cid not in m.containers
            # Nor does an expired token serve for a container this NM does not have.
            r = await cl.get(api.container_status_path(other_cid), headers=tokens.bearer(late))
            assert r.status == 401
            # A forged one (not signed with the cluster secret) serves for nothing.
            forged = _expired_container_token(node, cid, app, attempt, secret="forged")
            r = await cl.post(api.container_stop_path(cid), headers=tokens.bearer(forged))
            assert r.status == 401 and c.state is S.RUNNING
            # Another container's expired token does not serve for this one.
            r = await cl.get(api.container_status_path(cid), headers=tokens.bearer(late))
            assert r.status == 401

            r = await cl.get(api.container_status_path(cid), headers=tokens.bearer(expired))
            assert r.status == 200 and (await r.json())["state"] == "RUNNING"
            r = await cl.post(api.container_stop_path(cid), headers=tokens.bearer(expired))
            assert r.status == 200, await r.text()
            assert c.exit_status == ExitStatus.KILLED_BY_APPMASTER
    finally:
        await m.shutdown()
