"""The RM's utilization series (pure, fake clock), its REST endpoint and its Prometheus figures."""
from __future__ import annotations

from typing import Any

import msgspec
import pytest

from protocol import internal_api as api
from protocol.records import Resource
from rm import prometheus
from rm_testing import FakeClock, heartbeat, make_core, nm_claims, register, submit
from rm.utilization_series import UtilizationSeries
from prom_text import parse
from test_rm_api import BASE, close_env, make_env, nm_token

MB = 1024 * 1024
CAP = Resource(4096, 8)


def report(*containers: tuple[str, str, float, float], rx: float = 0.0, host_cpu: float = 0.0,
           spill: int = 0) -> api.NodeUtilization:
    cs = [api.ContainerUtilization(container_id=cid, app_id=app, cpu_cores=cpu, memory_mb=mem,
                                   spill_bytes=spill, role="worker") for cid, app, cpu, mem in containers]
    return api.NodeUtilization(cpu_cores=host_cpu, host_cores=4, memory_mb=1000, memory_total_mb=4000,
                               net_rx_bytes_per_s=rx, net_tx_bytes_per_s=rx / 2,
                               spill_bytes=spill * len(cs), containers_cpu_cores=sum(c.cpu_cores for c in cs),
                               containers_memory_mb=sum(c.memory_mb for c in cs), containers=tuple(cs))


def test_points_are_bucketed_per_interval_and_the_rings_are_bounded() -> None:
    s = UtilizationSeries(interval_ms=1000, node_points=3, cluster_points=5)
    for i in range(8):
        # Two heartbeats an interval: the later one replaces the earlier in its bucket.
        s.report("n:1", "h1", 100 + i, report(("c1", "a1", 0.1, 10.0)), CAP)
        s.report("n:1", "h1", 100 + i + 0.5, report(("c1", "a1", float(i), 10.0)), CAP)
    nodes = s.to_json()["utilization"]["nodes"]["n:1"]
    assert [p["t"] for p in nodes] == [105_500, 106_500, 107_500]
    assert [p["cpuCores"] for p in nodes] == [5.0, 6.0, 7.0]
    cluster = s.to_json()["utilization"]["cluster"]
    assert len(cluster) == 5 and cluster[-1]["vcoresTotal"] == 8 and cluster[-1]["memoryTotalMB"] == 4096
    assert [p["t"] for p in s.to_json(since_ms=106_500)["utilization"]["nodes"]["n:1"]] == [107_500]
    assert s.to_json(since_ms=107_500)["utilization"]["cluster"] == []


def test_cluster_sums_each_nodes_latest_and_each_host_once() -> None:
    s = UtilizationSeries()
    s.report("n:1", "h1", 10.0, report(("c1", "a1", 1.0, 100.0), rx=1000, host_cpu=3.0, spill=5), CAP)
    s.report("n:2", "h1", 10.1, report(("c2", "a1", 0.5, 50.0), rx=1000, host_cpu=3.0), CAP)
    s.report("n:3", "h2", 10.2, report(("c3", "a2", 2.0, 10.0), rx=200, host_cpu=1.0), CAP)
    last = s.to_json()["utilization"]["cluster"][-1]
    assert (last["cpuCores"], last["memoryMB"], last["spillBytes"]) == (3.5, 160.0, 5)
    # Two NMs on host h1 report the same host counters: the cluster counts h1 once.
    assert last["netRxBytesPerSec"] == 1200 and last["netTxBytesPerSec"] == 600 and last["hostCpuCores"] == 4.0
    # A node's next report replaces its share, it does not add to it.
    s.report("n:1", "h1", 10.3, report(("c1", "a1", 0.25, 100.0), rx=500, host_cpu=2.0), CAP)
    last = s.to_json()["utilization"]["cluster"][-1]
    assert (last["cpuCores"], last["netRxBytesPerSec"], last["spillBytes"]) == (2.75, 700, 0)
    assert s.apps["a1"].to_json() == {"cpuCores": 0.75, "memoryMB": 150.0, "spillBytes": 0, "containers": 2}
    # A report without the per-container list (the NM sends it every few seconds) moves the node's
    # sums; the per-application sums keep the node's last list.
    s.report("n:1", "h1", 10.35, msgspec.structs.replace(report(("c1", "a1", 0.5, 100.0), rx=500, host_cpu=2.0),
                                                         containers=None), CAP)
    assert s.to_json()["utilization"]["cluster"][-1]["cpuCores"] == 3.0
    assert s.apps["a1"].to_json()["cpuCores"] == 0.75 and len(s.latest["n:1"].containers) == 1
    # A lost node leaves the sums (its history stays); h1 still has n:2.
    s.forget_node("n:1", 10.4, CAP)
    last = s.to_json()["utilization"]["cluster"][-1]
    assert (last["cpuCores"], last["netRxBytesPerSec"]) == (2.5, 700)
    assert s.apps["a1"].containers == 1 and "n:1" in s.to_json()["utilization"]["nodes"]
    s.forget_node("n:2", 10.5, CAP)
    assert "a1" not in s.apps
    assert s.to_json()["utilization"]["cluster"][-1]["netRxBytesPerSec"] == 200


def test_core_feeds_the_series_from_heartbeats_and_forgets_lost_nodes() -> None:
    clock = FakeClock(1000.0)
    core = make_core(clock, nm_expiry_s=5)
    register(core, "n:1", mem=2048, vcores=2)
    register(core, "n:2", mem=2048, vcores=2)
    heartbeat(core, "n:1")                       # an NM that does not measure: nothing recorded
    assert core.utilization.to_json()["utilization"]["cluster"] == []
    for nid, cpu in (("n:1", 1.5), ("n:2", 0.5)):
        core.node_heartbeat(nm_claims(nid), api.NodeHeartbeatRequest(
            node_id=nid, response_id=core.nodes.nodes[nid].response_id, used=Resource(0, 0),
            utilization=report(("c" + nid, "a1", cpu, 64.0))))
    last = core.utilization.to_json()["utilization"]["cluster"][-1]
    assert last["cpuCores"] == 2.0 and last["vcoresTotal"] == 4 and last["t"] == 1_000_000
    clock.advance(6)
    heartbeat(core, "n:2")
    core.tick()                                   # n:1 is lost
    last = core.utilization.to_json()["utilization"]["cluster"][-1]
    assert last["cpuCores"] == 0.5 and last["vcoresTotal"] == 2


def test_a_decommissioned_nodes_last_figures_leave_the_cluster_sums() -> None:
    """It stops reporting once told to (not LOST: it was told): its last utilization must not
    stay in the cluster's sums for good."""
    clock = FakeClock(1000.0)
    core = make_core(clock)
    register(core, "n:1", mem=2048, vcores=2)
    register(core, "n:2", mem=2048, vcores=2)
    for nid, cpu in (("n:1", 1.5), ("n:2", 0.5)):
        core.node_heartbeat(nm_claims(nid), api.NodeHeartbeatRequest(
            node_id=nid, response_id=core.nodes.nodes[nid].response_id, used=Resource(0, 0),
            utilization=report(("c" + nid, "a1", cpu, 64.0))))
    core.decommission_node("n:1", None)
    clock.advance(1)
    heartbeat(core, "n:1")                        # nothing runs there: DECOMMISSIONED at once
    assert core.nodes.get("n:1").state.value == "DECOMMISSIONED"
    heartbeat(core, "n:2")
    last = core.utilization.to_json()["utilization"]["cluster"][-1]
    assert last["cpuCores"] == 0.5 and last["vcoresTotal"] == 2


# ----- REST and Prometheus ---------------------------------------------------------------------

async def send(env: Any, node_id: str, u: api.NodeUtilization, response_id: int = 0) -> None:
    req = api.NodeHeartbeatRequest(node_id=node_id, response_id=response_id, used=Resource(0, 0), utilization=u)
    await env.call("POST", api.NODE_HEARTBEAT, msgspec.to_builtins(req), token=nm_token(node_id))


@pytest.fixture
async def env(tmp_path):
    e = await make_env(tmp_path)
    yield e
    await close_env(e)


async def test_utilization_endpoint_contract(env) -> None:
    await env.register_node("n1:1", mem=4096, vcores=4)
    await env.register_node("n2:1", mem=4096, vcores=4)
    app_id = await env.submit()
    t0 = int(env.clock.t * 1000)
    await send(env, "n1:1", report(("c1", app_id, 1.5, 256.0), rx=100, spill=9))
    env.clock.advance(1.0)
    await send(env, "n1:1", report(("c1", app_id, 0.5, 128.0), rx=300), response_id=1)
    out = (await env.call("GET", BASE + "/utilization"))["utilization"]
    assert out["intervalMs"] == 1000 and set(out["nodes"]) == {"n1:1"}
    cluster = out["cluster"]
    assert [p["t"] for p in cluster] == [t0, t0 + 1000]
    assert set(cluster[0]) >= {"t", "cpuCores", "vcoresTotal", "memoryMB", "memoryTotalMB", "netRxBytesPerSec",
                               "netTxBytesPerSec", "spillBytes"}
    assert (cluster[0]["cpuCores"], cluster[0]["memoryMB"], cluster[0]["spillBytes"]) == (1.5, 256.0, 9)
    assert (cluster[1]["vcoresTotal"], cluster[1]["memoryTotalMB"], cluster[1]["netRxBytesPerSec"]) == (8, 8192, 300)
    node = out["nodes"]["n1:1"]
    assert [p["cpuCores"] for p in node] == [1.5, 0.5] and "vcoresTotal" not in node[0]
    since = (await env.call("GET", BASE + "/utilization", since=str(t0)))["utilization"]
    assert [p["t"] for p in since["cluster"]] == [t0 + 1000] and len(since["nodes"]["n1:1"]) == 1
    # A registered node that has not reported yet has an empty series; an unknown one is a 404.
    one = (await env.call("GET", BASE + "/utilization", node="n2:1"))["utilization"]
    assert one["nodes"] == {"n2:1": []} and len(one["cluster"]) == 2
    err = await env.call("GET", BASE + "/utilization", status=404, node="zz:9")
    assert err["RemoteException"]["exception"] == "NotFoundException"
    err = await env.call("GET", BASE + "/utilization", status=400, since="yesterday")
    assert "since" in err["RemoteException"]["message"]
    await env.call("GET", BASE + "/utilization", status=400, node="")
    # The latest figures in the node and app JSON.
    nodes = (await env.call("GET", BASE + "/nodes"))["nodes"]["node"]
    ru = {n["id"]: n.get("resourceUtilization") for n in nodes}
    assert ru["n2:1"] is None
    assert ru["n1:1"]["containersCPUUsage"] == 0.5 and ru["n1:1"]["aggregatedContainersPhysicalMemoryMB"] == 128
    assert ru["n1:1"]["netRxBytesPerSec"] == 300 and ru["n1:1"]["lastUpdate"] == t0 + 1000
    app = (await env.call("GET", BASE + f"/apps/{app_id}"))["app"]
    assert app["resourceUtilization"] == {"cpuCores": 0.5, "memoryMB": 128.0, "spillBytes": 0, "containers": 1}


async def test_rm_exposition_has_node_app_queue_and_role_labels(env) -> None:
    await env.register_node("n1:1")
    app_id = await env.submit(queue="research")
    await send(env, "n1:1", report(("c1", app_id, 1.5, 256.0), ("c2", "application_0_9999", 0.25, 1.0),
                                   rx=100, host_cpu=3.0, spill=4))
    r = await env.client.get("/metrics/prometheus")
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    fams = parse(await r.text())
    assert fams["elastane_rm_nm_heartbeats_total"].type == "counter"   # the existing families still parse
    assert fams["elastane_rm_node_cpu_cores"].value(node="n1:1") == 1.75
    assert fams["elastane_rm_node_host_cpu_cores"].value(node="n1:1") == 3.0
    assert fams["elastane_rm_node_network_transmit_bytes_per_second"].value(node="n1:1") == 50
    c = fams["elastane_rm_container_memory_bytes"]
    assert c.value(container="c1", node="n1:1", app=app_id, queue="research", role="worker") == 256 * MB
    # A container of an app the RM does not know has no queue label.
    assert "queue" not in [ls for ls, _ in c.samples if ls["container"] == "c2"][0]
    assert fams["elastane_rm_app_cpu_cores"].value(app=app_id, queue="research") == 1.5
    assert fams["elastane_rm_app_spill_bytes"].value(app=app_id) == 4
    assert fams["elastane_rm_cluster_cpu_cores"].value() == 1.75
    assert fams["elastane_rm_cluster_spill_bytes"].value() == 8


def test_rm_exposition_declares_every_family_before_any_report() -> None:
    core = make_core()
    submit(core)
    fams = parse(prometheus.render(core))
    assert fams["elastane_rm_node_cpu_cores"].samples == [] and fams["elastane_rm_cluster_cpu_cores"].samples == []
