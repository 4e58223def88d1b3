"""The web UI's server-rendered pages (JavaScript off): overview, app lists, nodes, one node,
scheduler; their live parts point at REST answers that hold what they render; the decision log;
the charts' markers; under token auth, the 401 the REST API answers."""
from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from protocol import internal_api as api
from protocol.config import ClusterConfig, RMConfig
from protocol.internal_api import RunState
from protocol.job_report import JobReport
from rm.decision_log import DecisionLog
from rm.policies.decision import Decision, JobDecision
from rm.policy_runner import apply_decision
from rm.server import ResourceManagerServer
from rm_testing import SECRET, FakeClock, launch_and_register, register
from rm.web.layout import get_path
from rm.web.svg_chart import Marker, Series, chart
from web_page_env import PageEnv, page_env_of

T0 = 1_700_000_000_000
UTILIZATION = {"utilization": {"intervalMs": 1000, "cluster": [
    {"t": T0 + 1000 * i, "cpuCores": 1.0 + i, "vcoresTotal": 8, "memoryMB": 1024.0 * (i + 1), "memoryTotalMB": 8192,
     "netRxBytesPerSec": 1e6, "netTxBytesPerSec": 2e6 * i, "spillBytes": 0} for i in range(3)],
    "nodes": {"n1:1": [{"t": T0 + 1000 * i, "cpuCores": 0.5 * i, "memoryMB": 100.0, "netRxBytesPerSec": 0.0,
                        "netTxBytesPerSec": 0.0, "spillBytes": 4096} for i in range(2)]}}}


@pytest.fixture
async def env(tmp_path):
    async for e in page_env_of(tmp_path):
        yield e


@pytest.fixture
async def util_env(tmp_path):
    async for e in page_env_of(tmp_path, UTILIZATION):
        yield e


def section(page: str, heading: str) -> str:
    return page.split(f"{heading}</h2>")[1].split("<h2>")[0]


def field(page: str, label: str) -> str:
    m = re.search(r"<th>" + re.escape(label) + r"</th><td[^>]*>(.*?)</td>", page)
    assert m, f"no field {label!r}"
    return re.sub(r"<[^>]+>", "", m.group(1))


def table_rows(page: str, css_id: str) -> list[list[str]]:
    table = page.split(f'id="{css_id}"')[1].split("</table>")[0]
    body = table.split("<tbody>")[1]
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)]
            for r in re.findall(r"<tr>(.*?)</tr>", body)]


def running_ps_app(env: PageEnv, name: str = "mf") -> tuple[str, dict[str, Any]]:
    app_id = env.submit(name=name, app_type="ELASTANE_PS")
    claims = launch_and_register(env.rm.core, app_id)
    return app_id, claims


async def test_overview_before_any_utilization_report(env: PageEnv) -> None:
    running, _ = running_ps_app(env, "<i>runner</i>")
    waiting = env.submit(name="waiter")
    page = await env.get("/cluster")
    assert field(page, "Submitted") == "2" and field(page, "Running") == "1" and field(page, "Pending") == "1"
    assert field(page, "Memory total") == "8 GB" and field(page, "Memory used") == "2 GB"   # both AMs hold a container
    assert field(page, "Active") == "1"
    assert [r[:3] for r in table_rows(page, "overview-nodes")] == [["n1:1", "/default-rack", "RUNNING"]]
    # The RM serves the utilization series; no NM has reported into it yet.
    assert section(page, "Cluster utilization").count("no data reported yet") == 4
    rows = table_rows(page, "running-apps")
    assert [r[0] for r in rows] == [running] and rows[0][2] == "<i>runner</i>" and waiting not in page
    assert "<i>runner" not in page                                           # escaped
    for href in ("/cluster/apps", "/cluster/nodes", "/cluster/scheduler", f"/cluster/app/{running}"):
        assert f'href="{href}"' in page


async def test_overview_and_node_charts_from_the_utilization_endpoint(util_env: PageEnv) -> None:
    page = await util_env.get("/cluster")
    charts = section(page, "Cluster utilization")
    for title in ("CPU (cores)", "Memory", "Network", "Disk spill"):
        assert f'aria-label="{title}"' in charts
    cpu = charts.split('id="util-cpu"')[1].split("</svg>")[0]
    assert len(re.findall(r"<polyline", cpu)) == 2                         # used and the vcores total
    assert len(re.search(r'points="([^"]*)"', cpu).group(1).split()) == 3
    assert ">9 GB<" not in charts and ">8 GB<" in charts                     # memory's y axis: the total
    node = await util_env.get("/cluster/node/n1:1")
    spill = section(node, "Utilization").split('id="util-spill"')[1].split("</svg>")[0]
    assert ">4 KB<" in spill
    assert 'data-src="/ws/v1/cluster/utilization?node=n1%3A1"' in node


async def test_empty_utilization_says_so(tmp_path) -> None:
    async for e in page_env_of(tmp_path, {"utilization": {"intervalMs": 1000, "cluster": [], "nodes": {}}}):
        page = await e.get("/cluster")
        assert "CPU (cores): no data reported yet." in page
        node = await e.get("/cluster/node/n1:1")
        assert "Network: no data reported yet." in node


async def test_app_lists_by_state(env: PageEnv) -> None:
    running, _ = running_ps_app(env)
    waiting = env.submit(name="<script>x</script>")
    page = await env.get("/cluster/apps")
    assert [r[0] for r in table_rows(page, "apps")] == [waiting, running]   # newest first
    assert "<script>x" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    for state in ("RUNNING", "running"):
        page = await env.get(f"/cluster/apps/{state}")
        assert [r[0] for r in table_rows(page, "apps")] == [running]
        assert 'data-src="/ws/v1/cluster/apps?states=RUNNING"' in page
    page = await env.get("/cluster/apps/FINISHED")
    assert table_rows(page, "apps") == [["no applications"]]
    page = await env.get("/cluster/apps/%3Cb%3E", status=404)
    assert "<b>" not in page.split("<main>")[1] and "&lt;b&gt;" in page


async def test_nodes_and_node_pages(env: PageEnv) -> None:
    register(env.rm.core, "n2:1", mem=4096, vcores=4)
    app_id, _ = running_ps_app(env)
    env.clock.advance(2.5)
    page = await env.get("/cluster/nodes")
    rows = table_rows(page, "nodes")
    assert [r[0] for r in rows] == ["n1:1", "n2:1"]
    assert rows[1][5:9] == ["0 B", "4 GB", "0", "4"] and rows[1][9] == "2.5 s ago"
    assert 'href="/cluster/node/n1%3A1"' in page
    am_node = env.rm.core.containers[next(iter(env.rm.core.attempts.values())).am_container_id].node_id
    node = await env.get(f"/cluster/node/{am_node}")
    assert field(node, "State") == "RUNNING" and field(node, "Containers") == "1"
    assert f'href="/cluster/app/{app_id}"' in section(node, "Containers")
    missing = await env.get("/cluster/node/%3Cscript%3E:1", status=404)
    assert "<script>:1" not in missing and "&lt;script&gt;:1" in missing


async def test_scheduler_page_shows_queues_and_decisions(env: PageEnv) -> None:
    app_id, claims = running_ps_app(env)
    env.rm.core.allocate(claims, api.AllocateRequest(response_id=0, shape=JobReport(workers=2, servers=1)))
    page = await env.get("/cluster/scheduler")
    assert table_rows(page, "decisions") == [["no directive changed yet"]]
    queue = table_rows(page, "queues")[0]
    assert queue[0] == "default" and queue[1] == "100%" and queue[5] == "1"
    core = env.rm.core
    apply_decision(core, Decision({app_id: JobDecision.spread(3, 1, ["n1:1"], "grow <fast>")}))
    env.clock.advance(1)
    apply_decision(core, Decision({app_id: JobDecision(3, 1, group="g1", run_state=RunState.PAUSE,
                                                       reason="harmony pause")}))
    page = await env.get("/cluster/scheduler")
    rows = table_rows(page, "decisions")
    assert [r[1:] for r in rows] == [
        [app_id, "2", "3", "1", "anywhere", "g1", "pause", "harmony pause"],
        [app_id, "1", "3", "1", "n1:1: 3 w + 1 s", "", "run", "grow <fast>"]]
    assert rows[0][0] == "0.0 s ago" and rows[1][0] == "1.0 s ago"
    assert "grow <fast>" not in page and "grow &lt;fast&gt;" in page
    app_page = await env.get(f"/cluster/app/{app_id}")
    assert field(app_page, "Group (Harmony)") == "g1" and field(app_page, "Run state") == "pause"
    speed = section(app_page, "Training over time")
    assert 'class="marker pause"' in speed and 'class="marker directive"' in speed


async def test_every_live_part_points_at_a_rest_answer_with_its_data(util_env: PageEnv) -> None:
    app_id, claims = running_ps_app(util_env)
    util_env.rm.core.allocate(claims, api.AllocateRequest(response_id=0, shape=JobReport(workers=2, servers=1)))
    apply_decision(util_env.rm.core, Decision({app_id: JobDecision(2, 2, reason="r")}))
    pages = ["/cluster", "/cluster/apps", "/cluster/apps/RUNNING", "/cluster/nodes", "/cluster/node/n1:1",
             "/cluster/scheduler", f"/cluster/app/{app_id}"]
    checked = 0
    for path in pages:
        page = await util_env.get(path)
        assert '<script src="/static/elastane-ui.js" defer>' in page
        for tag in re.findall(r"<(?:table|div) [^>]*data-src=[^>]*>", page):
            src = html.unescape(re.search(r'data-src="([^"]*)"', tag).group(1))
            body = await util_env.get_json(src)
            if "data-chart" in tag:
                spec = json.loads(html.unescape(re.search(r'data-chart="([^"]*)"', tag).group(1)))
                paths = [s["path"] for s in spec["series"]] + [m["path"] for m in spec.get("markers", [])]
            else:
                paths = [json.loads(html.unescape(re.search(r'data-path="([^"]*)"', tag).group(1)))]
            for p in paths:
                assert get_path(body, p) is not None, (path, src, p)
            checked += 1
    assert checked >= 20


async def test_the_script_is_served(env: PageEnv) -> None:
    resp = await env.client.get("/static/elastane-ui.js")
    assert resp.status == 200 and resp.content_type == "text/javascript"
    assert "data-src" in await resp.text()
    resp = await env.client.get("/", allow_redirects=False)
    assert resp.status == 302 and resp.headers["Location"] == "/cluster"


async def test_shape_endpoint_carries_samples_and_decisions(env: PageEnv) -> None:
    app_id, claims = running_ps_app(env)
    core = env.rm.core
    core.allocate(claims, api.AllocateRequest(response_id=0, shape=JobReport(workers=1, servers=1, speed=2.5)))
    apply_decision(core, Decision({app_id: JobDecision(2, 1, reason="more")}))
    shape = (await env.get_json(f"/ws/v1/cluster/apps/{app_id}/shape"))["shape"]
    assert [(s["workers"], s["speed"]) for s in shape["samples"]] == [(1, 2.5)]
    assert [(d["version"], d["workers"], d["reason"]) for d in shape["decisions"]] == [(1, 2, "more")]
    sched = (await env.get_json("/ws/v1/cluster/scheduler"))["scheduler"]["schedulerInfo"]["elastanePolicy"]
    assert sched["name"] == "static" and sched["decisions"][0]["appId"] == app_id


# ----- the decision log ----------------------------------------------------------------------------

def test_decision_log_records_only_changed_directives_and_is_bounded(env: PageEnv) -> None:
    core = env.rm.core
    a, _ = running_ps_app(env)
    b, _ = running_ps_app(env)
    apply_decision(core, Decision({a: JobDecision(2, 1, reason="x"), b: JobDecision(1, 1, reason="y")}))
    apply_decision(core, Decision({a: JobDecision(2, 1, reason="same shape, new words")}))   # not a change
    env.clock.advance(5)
    apply_decision(core, Decision({a: JobDecision(3, 1, reason="z")}))
    assert [(r.app_id, r.directive.version, r.directive.reason) for r in core.decisions] == [
        (a, 1, "x"), (b, 1, "y"), (a, 2, "z")]
    assert [r.directive.reason for r in core.decisions.for_app(a)] == ["x", "z"]
    assert [r.directive.reason for r in core.decisions.recent(2)] == ["z", "y"]
    rec = core.decisions.recent(1)[0].to_json()
    assert rec["time"] == int(core.clock() * 1000) and rec["runState"] == "run" and rec["placement"] == []

    log = DecisionLog(max_records=3)
    for i in range(10):
        log.record(float(i), "app", api.ShapeDirective(workers=i, servers=1, version=i))
    assert len(log) == 3 and [r.directive.version for r in log] == [7, 8, 9]
    with pytest.raises(ValueError):
        DecisionLog(0)


# ----- charts ---------------------------------------------------------------------------------------

def test_chart_draws_every_series_and_marks_events_on_the_time_axis() -> None:
    svg = chart("Speed", [Series("a", [(0, 1.0), (10, 2.0)]), Series("b", [(0, 0.5)]), Series("none", [])],
                [Marker(5, "shape: 2 \u2192 4 <workers>", "shape"), Marker(20, "directive v1", "pause")])
    assert svg.count("<polyline") == 2 and ">a</text>" in svg and ">none<" not in svg
    assert 'class="marker shape"' in svg and 'class="marker pause"' in svg
    assert "&lt;workers&gt;" in svg and "<workers>" not in svg
    # The axis spans the markers too: the one at x=20 is at the right edge, x=5 a quarter in.
    xs = [float(x) for x in re.findall(r'<line class="marker [a-z]+" x1="([0-9.]+)"', svg)]
    assert xs[1] == pytest.approx(625.0) and xs[0] == pytest.approx(60 + 565 / 4, abs=0.1)
    assert chart("Empty", [Series("a", [])], [Marker(1, "m")]) == '<p class="nochart">Empty: no data reported yet.</p>'


# ----- auth -----------------------------------------------------------------------------------------

async def test_under_token_auth_every_page_asks_for_a_client_token_as_the_rest_api_does(tmp_path: Any) -> None:
    """cluster.toml client_auth = "token": the REST API answers an anonymous caller 401, and so does
    every page (they show the same apps, users, diagnostics); a caller with a known token sees what
    the REST API shows them -- every app, as it has no view ACL on apps. The log pages keep their
    own answers; a redirect and the script show nothing and stay open."""
    cluster = ClusterConfig(secret=SECRET, client_auth="token", admins=["root"],
                            client_tokens={"t-alice": "alice", "t-bob": "bob"})
    rm = ResourceManagerServer(RMConfig(state_dir=str(tmp_path / "state")), cluster, clock=FakeClock(),
                               run_timers=False)
    register(rm.core, "n1:1")
    env = PageEnv(rm, TestClient(TestServer(rm.build_app())), FakeClock())
    await env.client.start_server()
    try:
        app_id = env.submit(name="alice-secret-project", user="alice")
        pages = ["/cluster", "/cluster/", "/cluster/apps", "/cluster/apps/ACCEPTED", "/cluster/apps/NOSUCH",
                 "/cluster/nodes", "/cluster/node/n1:1", "/cluster/node/nope:1", "/cluster/scheduler",
                 f"/cluster/app/{app_id}", "/cluster/app/application_1_0001"]
        refused = [{}, {"Authorization": "Bearer t-nobody"}, {"Authorization": "Basic YWxpY2U6eA=="}]
        for headers in refused:
            r = await env.client.get(f"/ws/v1/cluster/apps/{app_id}", headers=headers)
            assert r.status == 401, headers
            for path in pages:
                r = await env.client.get(path, headers=headers, params={"user.name": "alice"})
                text = await r.text()
                assert (r.status, r.content_type) == (401, "text/html"), (path, headers, text[:200])
                assert r.headers["WWW-Authenticate"] == "Bearer"
                assert "alice" not in text and app_id not in text and "n1:1" not in text, (path, headers)
                assert "Authorization: Bearer &lt;client token&gt;" in text
            r = await env.client.get(f"/cluster/logs/{app_id}", headers=headers)   # its own check, unchanged
            assert (r.status, r.content_type) == (401, "text/plain")
        for path in ("/", "/static/elastane-ui.js"):
            r = await env.client.get(path, allow_redirects=False)
            assert r.status in (200, 302), path
        # bob is not alice: the REST API shows him her app, and so do the pages.
        bob = {"Authorization": "Bearer t-bob"}
        rest = await (await env.client.get(f"/ws/v1/cluster/apps/{app_id}", headers=bob)).json()
        assert rest["app"]["name"] == "alice-secret-project"
        for path in pages:
            r = await env.client.get(path, headers=bob)
            status = 404 if path.endswith(("NOSUCH", "nope:1", "application_1_0001")) else 200
            assert (r.status, r.content_type) == (status, "text/html"), path
        for path in ("/cluster/apps", f"/cluster/app/{app_id}"):
            text = await (await env.client.get(path, headers=bob)).text()
            assert "alice-secret-project" in text and app_id in text
    finally:
        await rm.stop()
        await env.client.close()
