"""In-process tests of the RM's REST and internal APIs (aiohttp TestServer, fake clock, fake NM)."""
from __future__ import annotations

import asyncio

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from protocol import container_env, ps_job_spec, tokens
from protocol import internal_api as api
from protocol.config import ClusterConfig, QueueConfig, RMConfig
from protocol.records import Resource
from rm.server import ResourceManagerServer
from rm.submission import IGNORED_SUBMISSION_FIELDS
from fakes import FakeSignedNM
from rm_testing import SECRET, FakeClock

BASE = "/ws/v1/cluster"


class Env:
    """An RM under test plus a fake NM, with helpers that speak the internal API."""

    def __init__(self, rm: ResourceManagerServer, client: TestClient, nm: FakeSignedNM, nm_addr: str, clock: FakeClock):
        self.rm, self.client, self.nm, self.nm_addr, self.clock = rm, client, nm, nm_addr, clock

    async def call(self, method: str, path: str, body: Any = None, status: int = 200, token: str | None = None,
                   raw: bytes | None = None, **params: str) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        kw: dict[str, Any] = {"headers": headers, "params": params}
        if raw is not None:
            kw["data"] = raw
        elif body is not None:
            kw["json"] = body
        resp = await self.client.request(method, path, **kw)
        text = await resp.text()
        assert resp.status == status, f"{method} {path}: {resp.status} {text}"
        return await resp.json() if text and resp.content_type == "application/json" else resp

    async def register_node(self, node_id: str, mem: int = 8192, vcores: int = 8) -> None:
        req = api.NodeRegisterRequest(node_id=node_id, http_address=self.nm_addr, capability=Resource(mem, vcores))
        await self.call("POST", api.NODE_REGISTER, _b(req), token=nm_token(node_id))

    async def heartbeat(self, node_id: str, statuses: list[api.ContainerStatus] = (), response_id: int = 0) -> dict:
        req = api.NodeHeartbeatRequest(node_id=node_id, response_id=response_id, used=Resource(0, 0),
                                       container_statuses=list(statuses))
        return await self.call("POST", api.NODE_HEARTBEAT, _b(req), token=nm_token(node_id))

    async def submit(self, user: str = "alice", queue: str = "default", **extra: Any) -> str:
        new = await self.call("POST", BASE + "/apps/new-application", **{"user.name": user})
        body = submission(new["application-id"], queue=queue, **extra)
        await self.call("POST", BASE + "/apps", body, status=202, **{"user.name": user})
        return new["application-id"]

    async def launch_am(self) -> str:
        """Let the launcher reach the fake NM; return the AM token it passed in the env."""
        await self.rm.launcher.drain()
        _, req = self.nm.started[-1]
        return req.launch_context.environment[container_env.AM_TOKEN]

    async def app(self, app_id: str) -> dict:
        return (await self.call("GET", f"{BASE}/apps/{app_id}"))["app"]


def _b(msg: Any) -> Any:
    import msgspec
    return msgspec.to_builtins(msg)


def nm_token(node_id: str, secret: str = SECRET) -> str:
    return tokens.sign(secret, tokens.NM, {"node_id": node_id}, 3600)


def submission(app_id: str, queue: str = "default", memory: int = 1024, vcores: int = 1, **extra: Any) -> dict:
    body = {"application-id": app_id, "application-name": "job", "queue": queue,
            "am-container-spec": {"commands": {"command": "python am.py"},
                                  "environment": {"entry": [{"key": "FOO", "value": "bar"}]}},
            "resource": {"memory": memory, "vCores": vcores}, "max-app-attempts": 2,
            "application-type": "ELASTANE"}
    body.update(extra)
    return body


async def make_env(tmp_path, clock: FakeClock | None = None, cluster: ClusterConfig | None = None,
                   **cfg_kw: Any) -> Env:
    clock = clock or FakeClock()
    nm = FakeSignedNM()
    nm_server = TestServer(nm.app())
    await nm_server.start_server()
    cfg_kw.setdefault("queues", [QueueConfig("default", 70, 100), QueueConfig("research", 30, 50)])
    cfg = RMConfig(state_dir=str(tmp_path / "state"), **cfg_kw)
    rm = ResourceManagerServer(cfg, cluster or ClusterConfig(secret=SECRET, admins=["root"]), clock=clock,
                               run_timers=False)
    client = TestClient(TestServer(rm.build_app()))
    await client.start_server()
    rm.attach_launcher(str(client.make_url("")).rstrip("/"))
    env = Env(rm, client, nm, f"127.0.0.1:{nm_server.port}", clock)
    env._nm_server = nm_server  # type: ignore[attr-defined]
    return env


async def close_env(env: Env) -> None:
    await env.rm.stop()
    await env.client.close()
    await env._nm_server.close()  # type: ignore[attr-defined]


@pytest.fixture
async def env(tmp_path):
    e = await make_env(tmp_path)
    yield e
    await close_env(e)


# ----- submit flow -----------------------------------------------------------------------------

async def test_submit_flow_end_to_end_with_fake_nm(env: Env):
    await env.register_node("n1:1")
    app_id = await env.submit(elastane={})
    assert (await env.app(app_id))["state"] == "ACCEPTED"
    am_token = await env.launch_am()
    claims, req = env.nm.started[-1]
    assert claims["app_id"] == app_id and claims["node_id"] == "n1:1"
    envv = req.launch_context.environment
    assert envv["FOO"] == "bar" and envv[container_env.APP_SUBMITTER] == "alice"
    assert envv[container_env.RM_ADDRESS] == env.rm.url
    assert envv[container_env.APP_ATTEMPT_ID].startswith("appattempt_")
    assert req.launch_context.commands == ["python am.py"]
    reg = await env.call("POST", api.AM_REGISTER, {"tracking_url": "http://am:7"}, token=am_token)
    assert reg["app_id"] == app_id and reg["queue"] == "default"
    app = await env.app(app_id)
    assert app["state"] == "RUNNING" and app["trackingUrl"] == "http://am:7" and app["elastane"] == {}
    out = await env.call("POST", api.AM_ALLOCATE, {"response_id": 0, "progress": 0.5, "asks": [
        {"ask_id": 1, "count": 2, "resource": {"memory": 512, "vCores": 1}, "tag": "worker"}]}, token=am_token)
    assert len(out["allocated"]) == 2
    tok = out["allocated"][0]["container_token"]
    assert tokens.verify(SECRET, tok, tokens.CONTAINER)["container_id"] == out["allocated"][0]["container_id"]
    app = await env.app(app_id)
    assert app["runningContainers"] == 3 and app["allocatedMB"] == 2048 and app["progress"] == 50.0
    # A job report with a bad field is refused naming it, and changes nothing.
    bad = await env.call("POST", api.AM_ALLOCATE, {"response_id": out["response_id"], "shape": {
        "workers": 2, "servers": 1, "epoch_times": [1.0, -3.0]}}, status=400, token=am_token)
    assert "$.shape.epoch_times[1]" in bad["RemoteException"]["message"]
    assert (await env.call("GET", f"{BASE}/apps/{app_id}/shape"))["shape"]["current"] is None
    await env.call("POST", api.AM_ALLOCATE, {"response_id": out["response_id"], "shape": {
        "workers": 2, "servers": 1, "phase": "TRAINING", "objectives": [{"epoch": 0, "objective": 0.5}],
        "memory_mb": 300.0}}, token=am_token)
    shape = (await env.call("GET", f"{BASE}/apps/{app_id}/shape"))["shape"]
    cur = shape["current"]
    assert (cur["workers"], cur["servers"], cur["phase"], cur["memory_mb"]) == (2, 1, "TRAINING", 300.0)
    assert cur["objectives"] == [{"epoch": 0, "objective": 0.5}] and cur["spilled_mb"] == 0.0
    assert cur["iterations"] == 0 and all(v == 0 for v in cur["worker_times"].values())     # nothing measured yet
    assert {"compute_s", "comm_s", "workers"} <= set(cur["worker_times"])
    assert shape["directive"] is None and shape["policy"] == "static"
    assert (await env.app(app_id))["shape"] == cur
    assert [h["after"] for h in shape["history"]] == [{"workers": 2, "servers": 1}]
    assert shape["history"][0]["before"] is None and shape["history"][0]["time"] > 0
    attempts = (await env.call("GET", f"{BASE}/apps/{app_id}/appattempts"))["appAttempts"]["appAttempt"]
    assert [a["id"] for a in attempts] == [1] and attempts[0]["nodeId"] == "n1:1"
    await env.call("POST", api.AM_FINISH, {"final_status": "SUCCEEDED", "diagnostics": "done"}, token=am_token)
    app = await env.app(app_id)
    assert (app["state"], app["finalStatus"], app["progress"]) == ("FINISHED", "SUCCEEDED", 100.0)
    assert (await env.call("GET", f"{BASE}/apps/{app_id}/state")) == {"state": "FINISHED"}


async def test_submit_answers_202_with_location(env: Env):
    new = await env.call("POST", BASE + "/apps/new-application")
    assert new["maximum-resource-capability"] == {"memory": 65536, "vCores": 64}
    resp = await env.client.post(BASE + "/apps", json=submission(new["application-id"]))
    assert resp.status == 202
    assert resp.headers["Location"].endswith(f"{BASE}/apps/{new['application-id']}")
    assert (await env.app(new["application-id"]))["user"] == "dr.who"


async def test_ignored_fields_are_accepted(env: Env):
    new = await env.call("POST", BASE + "/apps/new-application")
    body = submission(new["application-id"])
    for name in IGNORED_SUBMISSION_FIELDS:
        body[name] = {"some": "value"} if name != "priority" else 3
    body["am-container-spec"]["service-data"] = {"entry": []}
    await env.call("POST", BASE + "/apps", body, status=202)


BAD_SUBMISSIONS = [
    ("malformed", None, "malformed JSON"),
    ("unknown field", {"bogus": 1}, "bogus"),
    ("wrong type", {"resource": {"memory": "lots", "vCores": 1}}, "memory"),
    ("zero memory", {"resource": {"memory": 0, "vCores": 1}}, "resource.memory"),
    ("negative vcores", {"resource": {"memory": 512, "vCores": -1}}, "resource.vCores"),
    ("unknown queue", {"queue": "nope"}, "queue"),
    ("too big", {"resource": {"memory": 10 ** 7, "vCores": 1}}, "maximum allocation"),
    ("empty command", {"am-container-spec": {"commands": {"command": "  "}}}, "commands.command"),
    ("zero attempts", {"max-app-attempts": 0}, "max-app-attempts"),
    ("missing spec", {"am-container-spec": None}, "am-container-spec"),
    # environments no process can be launched with: every attempt would fail at the NM
    ("env key with =", {"am-container-spec": {"commands": {"command": "true"},
                                              "environment": {"entry": [{"key": "A=B", "value": "x"}]}}},
     "environment.entry: key 'A=B' must not contain '=' or NUL"),
    ("env value with NUL", {"am-container-spec": {"commands": {"command": "true"},
                                                  "environment": {"entry": [{"key": "C", "value": "x\u0000y"}]}}},
     "environment.entry: the value of 'C' must not contain NUL"),
    # a key given twice: the last would win unseen
    ("env key twice", {"am-container-spec": {"commands": {"command": "true"}, "environment": {"entry": [
        {"key": "A", "value": "1"}, {"key": "A", "value": "2"}]}}},
     "am-container-spec.environment.entry: key 'A' is given twice"),
    # the extension's one key misspelt: the job would run as a plain app, the spec stored unread
    ("unknown elastane field", {"elastane": {"ps_job": {"app": "mlr"}}},
     "elastane: unknown field 'ps_job'; the only one is 'ps-job'"),
    ("unknown elastane fields", {"application-type": "ELASTANE_PS",
                                 "elastane": {"ps-job": {"app": "mlr"}, "note": 1, "x": {}}},
     "elastane: unknown fields 'note', 'x'"),
]


@pytest.mark.parametrize("case,change,needle", BAD_SUBMISSIONS, ids=[c[0] for c in BAD_SUBMISSIONS])
async def test_bad_submissions_are_400_and_create_nothing(env: Env, case, change, needle):
    new = await env.call("POST", BASE + "/apps/new-application")
    body = submission(new["application-id"])
    if change is None:
        out = await env.call("POST", BASE + "/apps", raw=b"{not json", status=400)
    else:
        body.update(change)
        if change.get("am-container-spec", 1) is None:
            del body["am-container-spec"]
        out = await env.call("POST", BASE + "/apps", body, status=400)
    err = out["RemoteException"]
    assert err["exception"] == "BadRequestException" and needle in err["message"]
    assert (await env.call("GET", BASE + "/apps")) == {"apps": None}
    assert (await env.call("GET", BASE + "/metrics"))["clusterMetrics"]["appsSubmitted"] == 0
    # The id is still usable after a rejected submission.
    await env.call("POST", BASE + "/apps", submission(new["application-id"]), status=202)


async def test_unknown_or_reused_application_id_is_400(env: Env):
    out = await env.call("POST", BASE + "/apps", submission("application_1_0001"), status=400)
    assert "new-application" in out["RemoteException"]["message"]
    app_id = await env.submit()
    # Another submission under the taken id -- another name, another command, another user -- is refused.
    for body, user in ((submission(app_id, **{"application-name": "other"}), "alice"),
                       (submission(app_id, **{"am-container-spec": {"commands": {"command": "python x.py"}}}),
                        "alice"),
                       (submission(app_id), "bob")):
        out = await env.call("POST", BASE + "/apps", body, status=400, **{"user.name": user})
        assert "already submitted" in out["RemoteException"]["message"]
    apps = (await env.call("GET", BASE + "/apps"))["apps"]["app"]
    assert [(a["id"], a["user"], a["name"]) for a in apps] == [(app_id, "alice", "job")]


async def test_the_same_submission_sent_again_is_accepted_and_changes_nothing(env: Env):
    """A client whose answer was lost (its RM failed over, or the answer timed out after the app
    was stored) sends the submission again: YARN answers the copy as a success, and so does the RM."""
    app_id = await env.submit()
    before = await env.app(app_id)
    resp = await env.call("POST", BASE + "/apps", submission(app_id), status=202, **{"user.name": "alice"})
    assert resp.headers["Location"].endswith(f"/ws/v1/cluster/apps/{app_id}")
    assert await env.app(app_id) == before
    metrics = (await env.call("GET", BASE + "/metrics"))["clusterMetrics"]
    assert metrics["appsSubmitted"] == 1


# ----- authentication ----------------------------------------------------------------------------

async def test_internal_calls_need_valid_tokens(env: Env):
    body = _b(api.NodeRegisterRequest(node_id="n1:1", http_address="x", capability=Resource(1024, 1)))
    for token in (None, nm_token("n1:1", secret="forged"), nm_token("other:1"), "garbage",
                  tokens.sign(SECRET, tokens.AM, {"app_id": "a", "attempt_id": "b"}, 60)):
        out = await env.call("POST", api.NODE_REGISTER, body, token=token, status=401)
        assert out["RemoteException"]["exception"] == "AuthenticationException"
    assert (await env.call("GET", BASE + "/nodes")) == {"nodes": None}
    for path in (api.AM_REGISTER, api.AM_ALLOCATE, api.AM_FINISH):
        await env.call("POST", path, {"response_id": 0}, token=nm_token("n1:1"), status=401)
    forged_am = tokens.sign("forged", tokens.AM, {"app_id": "a", "attempt_id": "b"}, 60)
    await env.call("POST", api.AM_REGISTER, {}, token=forged_am, status=401)


async def test_bad_internal_bodies_are_400(env: Env):
    await env.call("POST", api.NODE_REGISTER, {"node_id": "n1:1"}, token=nm_token("n1:1"), status=400)
    await env.call("POST", api.NODE_REGISTER, raw=b"[", token=nm_token("n1:1"), status=400)
    # a capability whose sums over the nodes would not fit the metrics' 64-bit numbers
    huge = _b(api.NodeRegisterRequest(node_id="n2:1", http_address="x", capability=Resource(2 ** 63, 1)))
    out = await env.call("POST", api.NODE_REGISTER, huge, token=nm_token("n2:1"), status=400)
    assert "capability must be within memory 1..1073741824 MB" in out["RemoteException"]["message"]
    await env.register_node("n1:1")
    app_id = await env.submit()
    am_token = await env.launch_am()
    out = await env.call("POST", api.AM_REGISTER, {"rpc_port": 70000}, token=am_token, status=400)
    assert "rpc_port must be a port" in out["RemoteException"]["message"]
    await env.call("POST", api.AM_REGISTER, {}, token=am_token)
    out = await env.call("POST", api.AM_ALLOCATE, {"response_id": 0, "asks": [
        {"ask_id": 1, "count": 1, "resource": {"memory": 10 ** 8, "vCores": 1}}]}, token=am_token, status=400)
    assert "maximum allocation" in out["RemoteException"]["message"]
    out = await env.call("POST", api.AM_ALLOCATE, {"response_id": 0, "asks": [
        {"ask_id": 1, "count": 2 ** 64 - 1, "resource": {"memory": 128, "vCores": 1}}]}, token=am_token, status=400)
    assert "asks[0].count must be within 0..2147483647" in out["RemoteException"]["message"]
    out = await env.call("POST", api.AM_ALLOCATE, {"response_id": 0, "shape": {
        "workers": 1, "servers": 1, "directive_version": 2 ** 64 - 1}}, token=am_token, status=400)
    assert "$.shape.directive_version" in out["RemoteException"]["message"]
    await env.call("POST", api.AM_FINISH, {"final_status": "MAYBE"}, token=am_token, status=400)
    assert (await env.app(app_id))["state"] == "RUNNING"
    metrics = (await env.call("GET", BASE + "/metrics"))["clusterMetrics"]      # still served
    assert metrics["containersPending"] == 0 and metrics["totalNodes"] == 1


async def test_kill_permissions(env: Env):
    app_id = await env.submit(user="alice")
    out = await env.call("PUT", f"{BASE}/apps/{app_id}/state", {"state": "KILLED"}, status=403,
                         **{"user.name": "mallory"})
    assert out["RemoteException"]["exception"] == "ForbiddenException"
    assert (await env.app(app_id))["state"] == "ACCEPTED"
    await env.call("PUT", f"{BASE}/apps/{app_id}/state", {"state": "RUNNING"}, status=400, **{"user.name": "alice"})
    out = await env.call("PUT", f"{BASE}/apps/{app_id}/state", {"state": "KILLED"}, status=202,
                         **{"user.name": "alice"})
    assert out == {"state": "KILLED"}
    await env.call("PUT", f"{BASE}/apps/{app_id}/state", {"state": "KILLED"}, status=200, **{"user.name": "alice"})
    other = await env.submit(user="bob")
    await env.call("PUT", f"{BASE}/apps/{other}/state", {"state": "KILLED"}, status=202, **{"user.name": "root"})
    app = await env.app(other)
    assert (app["state"], app["finalStatus"]) == ("KILLED", "KILLED")
    await env.call("GET", f"{BASE}/apps/application_1_0009", status=404)


async def test_killed_app_am_gets_shutdown_and_nm_cleanup(env: Env):
    await env.register_node("n1:1")
    app_id = await env.submit()
    am_token = await env.launch_am()
    await env.call("POST", api.AM_REGISTER, {}, token=am_token)
    await env.call("PUT", f"{BASE}/apps/{app_id}/state", {"state": "KILLED"}, status=202, **{"user.name": "alice"})
    out = await env.call("POST", api.AM_ALLOCATE, {"response_id": 1}, token=am_token)
    assert out["action"] == "SHUTDOWN"
    hb = await env.heartbeat("n1:1")
    assert len(hb["containers_to_cleanup"]) == 1 and hb["apps_to_cleanup"] == [app_id]


# ----- listing ------------------------------------------------------------------------------------

async def test_app_list_filters(env: Env):
    a = await env.submit(user="alice")
    b = await env.submit(user="bob", queue="research", **{"application-type": "MapReduce"})
    c = await env.submit(user="bob")
    await env.call("PUT", f"{BASE}/apps/{c}/state", {"state": "KILLED"}, status=202, **{"user.name": "bob"})

    async def ids(**params: str) -> list[str]:
        out = await env.call("GET", BASE + "/apps", **params)
        return [x["id"] for x in out["apps"]["app"]] if out["apps"] else []

    assert await ids() == [a, b, c]
    assert await ids(states="accepted") == [a, b]
    assert await ids(states="KILLED,finished") == [c]
    assert await ids(user="bob") == [b, c]
    assert await ids(queue="research") == [b]
    assert await ids(limit="2") == [a, b]
    assert await ids(states="RUNNING") == []
    # application types compare lower-cased, as YARN's do
    assert await ids(applicationTypes="mapreduce") == await ids(applicationTypes="MAPREDUCE, yarn") == [b]
    assert await ids(applicationTypes="Elastane,MapReduce") == [a, b, c]
    out = await env.call("GET", BASE + "/apps", status=400, states="SLEEPING")
    assert "SLEEPING" in out["RemoteException"]["message"]
    await env.call("GET", BASE + "/apps", status=400, limit="x")
    await env.call("GET", BASE + "/apps", status=400, limit="0")


async def test_cluster_endpoints(env: Env):
    await env.register_node("n1:1", mem=4096, vcores=4)
    await env.register_node("n2:1", mem=4096, vcores=4)
    await env.submit()
    info = (await env.call("GET", BASE + "/info"))["clusterInfo"]
    assert info["state"] == "STARTED" and info["haState"] == "ACTIVE"
    assert (await env.call("GET", BASE))["clusterInfo"]["id"] == info["id"]
    m = (await env.call("GET", BASE + "/metrics"))["clusterMetrics"]
    assert (m["totalMB"], m["allocatedMB"], m["activeNodes"], m["appsPending"]) == (8192, 1024, 2, 1)
    s = (await env.call("GET", BASE + "/scheduler"))["scheduler"]["schedulerInfo"]
    assert s["type"] == "capacityScheduler" and s["queueName"] == "root"
    qs = {q["queueName"]: q for q in s["queues"]["queue"]}
    assert qs["default"]["capacity"] == 70 and qs["research"]["maxCapacity"] == 50
    assert qs["default"]["resourcesUsed"] == {"memory": 1024, "vCores": 1}
    assert qs["default"]["numApplications"] == 1 and qs["default"]["type"] == "capacitySchedulerLeafQueueInfo"
    nodes = (await env.call("GET", BASE + "/nodes"))["nodes"]["node"]
    assert {n["id"] for n in nodes} == {"n1:1", "n2:1"}
    assert (await env.call("GET", BASE + "/nodes", states="LOST")) == {"nodes": None}
    await env.call("GET", BASE + "/nodes", states="BROKEN", status=400)
    node = (await env.call("GET", BASE + "/nodes/n1:1"))["node"]
    assert node["nodeHTTPAddress"] == env.nm_addr and node["state"] == "RUNNING"
    registered = node["lastHeartbeat"]
    env.clock.advance(7.5)
    await env.heartbeat("n1:1")            # a heartbeat moves lastHeartbeat, not lastHealthUpdate
    node = (await env.call("GET", BASE + "/nodes/n1:1"))["node"]
    assert node["lastHeartbeat"] == registered + 7500 and node["lastHealthUpdate"] == registered
    out = await env.call("GET", BASE + "/nodes/zz:1", status=404)
    assert out["RemoteException"]["exception"] == "NotFoundException"
    prom = await env.client.get("/metrics/prometheus")
    text = await prom.text()
    assert 'elastane_rm_apps{state="ACCEPTED"} 1' in text and 'elastane_rm_memory_mb{kind="total"} 8192' in text
    page = await env.client.get("/cluster")
    assert page.status == 200 and "n1:1" in await page.text()
    root = await env.client.get("/", allow_redirects=False)
    assert root.status == 302 and root.headers["Location"] == "/cluster"



async def test_error_bodies_for_routing_failures_and_bugs(env: Env, monkeypatch, caplog):
    """Unknown API paths and wrong methods get YARN's RemoteException body; other paths aiohttp's
    own answer; a bug is a 500 with the body (logged), and the RM goes on serving."""
    out = await env.call("GET", BASE + "/nosuch", status=404)
    assert out["RemoteException"]["exception"] == "NotFoundException"
    assert out["RemoteException"]["javaClassName"] == "javax.ws.rs.WebApplicationException"
    out = await env.call("GET", api.NODE_HEARTBEAT, status=405)
    assert out["RemoteException"]["exception"] == "WebApplicationException"
    plain = await env.call("GET", "/nosuch", status=404)
    assert plain.content_type != "application/json"

    def broken(*a: Any) -> None:
        raise RuntimeError("boom")
    monkeypatch.setattr(env.rm.core, "node_heartbeat", broken)
    await env.register_node("n1:1")
    out = await env.call("POST", api.NODE_HEARTBEAT, _b(api.NodeHeartbeatRequest(
        node_id="n1:1", response_id=0, used=Resource(0, 0))), token=nm_token("n1:1"), status=500)
    assert out["RemoteException"] == {"exception": "InternalError", "message": "RuntimeError: boom",
                                      "javaClassName": "java.lang.RuntimeException"}
    assert "internal error serving POST " + api.NODE_HEARTBEAT in caplog.text
    monkeypatch.undo()
    assert (await env.heartbeat("n1:1"))["action"] == "NORMAL"


# ----- liveness (driven with the fake clock) -------------------------------------------------------

async def test_lost_node_is_reported_to_the_am_as_aborted(tmp_path):
    env = await make_env(tmp_path, nm_expiry_s=10, am_expiry_s=1000)
    try:
        await env.register_node("am:1")
        app_id = await env.submit()
        am_token = await env.launch_am()
        await env.call("POST", api.AM_REGISTER, {}, token=am_token)
        await env.register_node("w:1")
        out = await env.call("POST", api.AM_ALLOCATE, {"response_id": 0, "asks": [
            {"ask_id": 1, "count": 1, "resource": {"memory": 1024, "vCores": 1}, "nodes": ["w:1"],
             "relax_locality": False}]}, token=am_token)
        (c,) = out["allocated"]
        assert c["node_id"] == "w:1"
        for _ in range(3):
            env.clock.advance(5)
            await env.heartbeat("am:1")
            env.rm.core.tick()
        out = await env.call("POST", api.AM_ALLOCATE, {"response_id": 1}, token=am_token)
        assert [(s["container_id"], s["exit_status"]) for s in out["completed"]] == [(c["container_id"], -100)]
        assert out["updated_nodes"][0]["state"] == "LOST"
        assert (await env.call("GET", BASE + "/nodes/w:1"))["node"]["state"] == "LOST"
        assert (await env.heartbeat("w:1"))["action"] == "RESYNC"
        assert (await env.app(app_id))["state"] == "RUNNING"
    finally:
        await close_env(env)


async def test_am_expiry_gives_a_new_attempt(tmp_path):
    env = await make_env(tmp_path, nm_expiry_s=1000, am_expiry_s=5)
    try:
        await env.register_node("n1:1")
        app_id = await env.submit()
        first = await env.launch_am()
        await env.call("POST", api.AM_REGISTER, {}, token=first)
        env.clock.advance(6)
        await env.heartbeat("n1:1")   # the node lives: its AM itself stopped
        env.rm.core.tick()
        await env.heartbeat("n1:1")   # the new attempt's AM container is placed on the next heartbeat
        second = await env.launch_am()
        assert second != first and len(env.nm.started) == 2
        attempts = (await env.call("GET", f"{BASE}/apps/{app_id}/appattempts"))["appAttempts"]["appAttempt"]
        assert [a["appAttemptState"] for a in attempts] == ["FAILED", "LAUNCHED"]
        assert "timed out" in attempts[0]["diagnosticsInfo"]
        await env.call("POST", api.AM_REGISTER, {}, token=first, status=401)
        assert (await env.call("POST", api.AM_ALLOCATE, {"response_id": 3}, token=first))["action"] == "SHUTDOWN"
        await env.call("POST", api.AM_REGISTER, {}, token=second)
        assert (await env.app(app_id))["state"] == "RUNNING"
    finally:
        await close_env(env)


# ----- restart ---------------------------------------------------------------------------------------

async def test_state_store_recovery_across_restart(tmp_path):
    env = await make_env(tmp_path)
    await env.register_node("n1:1")
    done = await env.submit()
    tok = await env.launch_am()
    await env.call("POST", api.AM_REGISTER, {}, token=tok)
    await env.call("POST", api.AM_FINISH, {"final_status": "FAILED", "diagnostics": "bad data"}, token=tok)
    running = await env.submit(user="bob", elastane={})
    old_token = await env.launch_am()
    await env.call("POST", api.AM_REGISTER, {}, token=old_token)
    await close_env(env)

    env2 = await make_env(tmp_path)
    try:
        listed = (await env2.call("GET", BASE + "/apps"))["apps"]["app"]
        assert [a["id"] for a in listed] == [done, running]
        d = await env2.app(done)
        assert (d["state"], d["finalStatus"], d["diagnostics"]) == ("FINISHED", "FAILED", "bad data")
        r = await env2.app(running)
        # Work-preserving: the running attempt is kept, its AM told to register again.
        assert r["state"] == "RUNNING" and r["user"] == "bob" and r["elastane"] == {}
        attempts = (await env2.call("GET", f"{BASE}/apps/{running}/appattempts"))["appAttempts"]["appAttempt"]
        assert [a["appAttemptState"] for a in attempts] == ["RUNNING"]
        refused = await env2.call("POST", api.AM_ALLOCATE, {"response_id": 9}, token=old_token, status=400)
        assert refused["RemoteException"]["exception"] == "ApplicationMasterNotRegisteredException"
        await env2.call("POST", api.AM_REGISTER, {}, token=old_token)
        assert (await env2.call("POST", api.AM_ALLOCATE, {"response_id": 0}, token=old_token))["action"] == "NORMAL"
        # Its node comes back without the AM container: the attempt is over (not counted) and a new
        # one is launched.
        await env2.register_node("n1:1")
        new_token = await env2.launch_am()
        assert new_token != old_token
        await env2.call("POST", api.AM_REGISTER, {}, token=new_token)
        assert (await env2.app(running))["state"] == "RUNNING"
        attempts = (await env2.call("GET", f"{BASE}/apps/{running}/appattempts"))["appAttempts"]["appAttempt"]
        assert [a["appAttemptState"] for a in attempts] == ["FAILED", "RUNNING"]
        # New ids do not collide with recovered ones.
        assert await env2.submit() not in (done, running)
    finally:
        await close_env(env2)


async def test_a_ps_job_keeps_its_typed_spec_across_a_restart(tmp_path):
    """The spec decoded at submission is what the app record, the REST view, the AM's env and, after
    a restart, the recovered app hold; the app stays a PS job for the shape API."""
    env = await make_env(tmp_path, minimum_allocation_mb=256)
    await env.register_node("n1:1")
    given = {"app": "mlr", "workers": 2, "servers": 1, "max_workers": 4, "executor_memory_mb": 300}
    app_id = await env.submit(**{"application-type": "ELASTANE_PS", "elastane": {"ps-job": given}})
    spec = env.rm.core.apps[app_id].ps.spec
    assert spec == ps_job_spec.validate(given)
    shown = (await env.app(app_id))["elastane"]
    assert list(shown) == ["ps-job"] and ps_job_spec.validate(shown["ps-job"]) == spec
    assert {k: shown["ps-job"][k] for k in given} == given
    await env.launch_am()
    assert ps_job_spec.validate(env.nm.started[-1][1].launch_context.environment[ps_job_spec.PS_SPEC_ENV]) == spec
    await close_env(env)

    env2 = await make_env(tmp_path, minimum_allocation_mb=256)
    try:
        app = env2.rm.core.apps[app_id]
        assert app.ps is not None and app.ps.spec == spec and app.ps.executor.memory == 512
        assert (await env2.app(app_id))["elastane"] == shown
        await env2.call("PUT", f"{BASE}/apps/{app_id}/shape", {"workers": 3, "servers": 1}, **{"user.name": "alice"})
        assert app.directive is not None and app.directive.workers == 3
    finally:
        await close_env(env2)


async def test_client_token_auth(tmp_path):
    cluster = ClusterConfig(secret=SECRET, client_auth="token", client_tokens={"t-alice": "alice"})
    env = await make_env(tmp_path, cluster=cluster)
    try:
        await env.call("GET", BASE + "/apps", status=401)
        await env.call("GET", BASE + "/apps", token="wrong", status=401)
        new = await env.call("POST", BASE + "/apps/new-application", token="t-alice")
        await env.call("POST", BASE + "/apps", submission(new["application-id"]), token="t-alice", status=202)
        assert (await env.call("GET", f"{BASE}/apps/{new['application-id']}", token="t-alice"))["app"]["user"] == "alice"
    finally:
        await close_env(env)


async def test_store_failure_on_submit_leaves_nothing(tmp_path):
    env = await make_env(tmp_path)
    try:
        def broken(*a: Any, **kw: Any) -> None:
            raise OSError("disk full")
        env.rm.store.save_app = broken  # type: ignore[method-assign]
        new = await env.call("POST", BASE + "/apps/new-application")
        out = await env.call("POST", BASE + "/apps", submission(new["application-id"]), status=503)
        assert "disk full" in out["RemoteException"]["message"]
        assert (await env.call("GET", BASE + "/apps")) == {"apps": None}
        assert env.rm.core.scheduler.apps == {}
    finally:
        del env.rm.store.save_app   # back to the real method, so shutdown can flush
        await close_env(env)


async def test_an_am_whose_app_was_killed_while_it_started_is_stopped(tmp_path):
    """A kill between the launch's request to the NM and its answer: the cleanup the kill sends may
    reach the node before the start and find nothing; the launcher stops the AM it then started,
    so it neither runs for a killed app nor holds resources the RM has let go."""
    import asyncio   # noqa: PLC0415
    env = await make_env(tmp_path)
    try:
        env.nm.hold = asyncio.Event()
        await env.register_node("n1:1")
        app_id = await env.submit()
        await asyncio.wait_for(env.nm.arrived.wait(), 30)         # the start is at the node
        await env.call("PUT", f"{BASE}/apps/{app_id}/state", {"state": "KILLED"}, status=202, **{"user.name": "alice"})
        (attempt,) = env.rm.core.apps[app_id].attempts
        am = env.rm.core.attempts[attempt].am_container_id
        env.nm.hold.set()
        await env.rm.launcher.drain()
        assert env.nm.stopped == [am]
        app = await env.app(app_id)
        assert app["state"] == "KILLED" and env.rm.core.attempts[attempt].state.value == "KILLED"
    finally:
        await close_env(env)


async def test_a_stopping_rm_starts_no_am(tmp_path):
    """An AM launch the RM's last flush would ask for is left to the next RM (which recovers the
    attempt), not sent by a launcher that is closing: nothing would record its outcome, and its
    task would outlive the RM."""
    from rm_testing import register, submit as core_submit   # noqa: PLC0415
    env = await make_env(tmp_path)
    app_id = core_submit(env.rm.core)
    register(env.rm.core, env.nm_addr)          # the AM is placed; its launch waits for a flush
    assert env.rm.core.effects
    await close_env(env)
    launches = [t for t in asyncio.all_tasks() if "AmLauncher._launch" in t.get_coro().__qualname__]
    assert launches == [] and env.nm.started == []
    assert env.rm.core.apps[app_id].state.value == "ACCEPTED"


async def test_am_launch_failure_fails_the_attempt(tmp_path):
    env = await make_env(tmp_path, max_app_attempts=1)
    try:
        env.nm.refuse = True
        await env.register_node("n1:1")
        app_id = await env.submit()
        await env.rm.launcher.drain()
        app = await env.app(app_id)
        assert (app["state"], app["finalStatus"]) == ("FAILED", "FAILED")
        assert "Error launching" in app["diagnostics"] and "launch refused" in app["diagnostics"]
        assert (tmp_path / "state" / "apps" / app_id).is_dir()
        # The never-launched AM container stays charged to the node until its NM confirms it does
        # not have it: asked to clean it up, the NM's next heartbeat does not report it.
        node = (await env.call("GET", BASE + "/nodes/n1:1"))["node"]
        assert node["usedMemoryMB"] == 1024
        hb = await env.heartbeat("n1:1")
        assert len(hb["containers_to_cleanup"]) == 1
        await env.heartbeat("n1:1", response_id=hb["response_id"])
        node = (await env.call("GET", BASE + "/nodes/n1:1"))["node"]
        assert node["usedMemoryMB"] == 0
    finally:
        await close_env(env)


# ----- shape directives from the owner (Elastane extension) -----------------------------------------

async def test_put_shape_directs_an_elastic_job_and_refuses_bad_input(env: Env):
    await env.register_node("n1:1")
    await env.register_node("n2:1")
    ps = {"application-type": "ELASTANE_PS",
          "elastane": {"ps-job": {"app": "mlr", "workers": 2, "servers": 2, "max_workers": 3}}}
    app_id = await env.submit(user="alice", **ps)
    blocks = ps_job_spec.BLOCKS_PER_SERVER * 2
    path = f"{BASE}/apps/{app_id}/shape"
    shape = {"workers": 1, "servers": 1, "nodes": ["n2:1"]}
    out = await env.call("PUT", path, shape, status=403, **{"user.name": "mallory"})
    assert out["RemoteException"]["exception"] == "ForbiddenException"
    for bad, needle in [({"workers": 0, "servers": 1}, "workers"), ({"workers": 1}, "servers"),
                        ({"workers": 1, "servers": 1, "nodes": ["n9:1"]}, "n9:1"),
                        ({"workers": 1, "servers": 1, "colour": "red"}, "colour"),
                        ({"workers": 2, "servers": 1, "nodes": ["n1:1", "n1:1"]}, "nodes: each node may be named once"),
                        ({"workers": 4, "servers": 1}, "workers: 4 is more than this job's max_workers of 3"),
                        ({"workers": 1, "servers": blocks + 1},
                         f"servers: {blocks + 1} is more than this job's {blocks} model blocks")]:
        out = await env.call("PUT", path, bad, status=400, **{"user.name": "alice"})
        assert needle in out["RemoteException"]["message"], out
    assert (await env.call("GET", path))["shape"]["directive"] is None      # refusals changed nothing
    out = await env.call("PUT", path, shape, **{"user.name": "alice"})
    d = out["shape"]["directive"]
    assert (d["workers"], d["servers"], d["nodes"], d["version"]) == (1, 1, ["n2:1"], 1)
    assert d["reason"] == "set by alice"
    await env.call("PUT", path, shape, **{"user.name": "root"})               # the same again: no new version
    assert (await env.call("GET", path))["shape"]["directive"]["version"] == 1
    plain = await env.submit(user="alice")
    out = await env.call("PUT", f"{BASE}/apps/{plain}/shape", shape, status=400, **{"user.name": "alice"})
    assert "not an elastic PS job" in out["RemoteException"]["message"]


async def test_put_shape_refuses_a_shape_below_the_jobs_minimums_and_a_long_reason(env: Env):
    """Below min_workers / min_servers the AM would clamp the directive up unseen: a 400 naming the
    minimum, nothing stored. A pause gives every executor back, so its shape may be below them.
    A reason is a note (stored, sent to the AM): at most 1024 characters."""
    await env.register_node("n1:1")
    ps = {"application-type": "ELASTANE_PS", "elastane": {"ps-job": {
        "app": "mlr", "workers": 3, "servers": 2, "min_workers": 2, "min_servers": 2, "max_workers": 4}}}
    app_id = await env.submit(user="alice", **ps)
    path = f"{BASE}/apps/{app_id}/shape"
    for bad, needle in [({"workers": 1, "servers": 2}, "workers: 1 is less than this job's min_workers of 2"),
                        ({"workers": 2, "servers": 1}, "servers: 1 is less than this job's min_servers of 2"),
                        ({"workers": 1, "servers": 1, "runState": "resume"}, "min_workers of 2"),
                        ({"workers": 2, "servers": 2, "reason": "r" * 1025}, "length <= 1024 - at `$.reason`")]:
        out = await env.call("PUT", path, bad, status=400, **{"user.name": "alice"})
        assert needle in out["RemoteException"]["message"], out
        assert env.rm.core.apps[app_id].directive is None            # nothing stored
    d = (await env.call("PUT", path, {"workers": 2, "servers": 2, "reason": "r" * 1024},
                        **{"user.name": "alice"}))["shape"]["directive"]
    assert (d["workers"], d["servers"], d["reason"]) == (2, 2, "r" * 1024)
    d = (await env.call("PUT", path, {"workers": 1, "servers": 1, "runState": "pause"},
                        **{"user.name": "alice"}))["shape"]["directive"]
    assert (d["workers"], d["servers"], d["runState"]) == (1, 1, "pause")
